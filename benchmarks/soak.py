"""Soak test: a long mixed workload against a real server, watching for slow degradation.

``make soak ARGS="--minutes 20"`` (or ``python benchmarks/soak.py --minutes 20``) starts
``server.py`` on a free port with a small KV pool and a short waiting queue, then repeats
whole cycles until ``--minutes`` are over (the last cycle started before then runs to its
end): a load phase of ``--cycle-s`` minus ``--idle-s`` seconds (Poisson arrivals at
``--rate`` requests/s, and halfway through a burst of ``--burst`` requests at once, more
than the queue holds, so that 429s happen), the wait for every answer, then an idle gap of
``--idle-s`` seconds with nothing sent. Every cycle replays the same seeded load phase
(`cycle_pattern`): the same arrival times, request kinds, prompt and output lengths,
prompt texts and sampling seeds, so that two cycles differ only in what the server does
(the TTFT stability check compares whole cycles: `soak_report.ttft_stable`). The
requests mix:
  * chat requests sharing one system prompt (prefix caching) and plain completions, with
    random prompt lengths and random ``max_tokens``; half of them streamed;
  * ``--n2-share`` (10%) with ``n = 2``;
  * ``--abort-share`` (10%) streamed and closed by the client after a few events;
  * ``--timeout-share`` (5%) with a ``request_timeout`` far below their generation time (504,
    or an error event in the stream: expected).
Every ``--sample-s`` seconds it samples the server process's RSS, open file descriptors and
threads (psutil) and ``/metrics`` (KV blocks free and every counter); at the end of every
idle gap it checks KV blocks free, fds and threads again.

Writes ``benchmarks/results/<date>-<device>/soak.json`` (settings, samples, idle-gap checks,
per-request records, the acceptance verdict of `soak_report.evaluate`) and ``soak.png``
(`soak_report.plot`); ``--out DIR`` writes there instead. ``--url URL --server-pid PID``
soaks a server that is already running instead of starting one. Exit status 0 when every
acceptance check passes, 1 otherwise. The load generator is plain Python (httpx, asyncio);
no JAX in this process.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import logging
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import soak_report  # noqa: E402
from machine_info import device_label  # noqa: E402
from llamacpp_peer import free_port, wait_healthy  # noqa: E402

from jaxinfer.bench import metadata  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("soak")

WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health person "
         "art war history party result change morning reason research girl guy moment air teacher force education").split()
SYSTEM_PROMPT = ("You are a careful, friendly assistant for a public library. Answer in plain words, keep answers "
                 "short unless asked for detail, say so when you do not know, never invent book titles, and "
                 "suggest where in the library a reader could look next. ") * 3


@dataclasses.dataclass
class Spec:
    """One request of the mix."""

    chat: bool
    stream: bool
    n: int
    max_tokens: int
    words: int
    abort_after: int | None  # close the stream after this many events (None: read to the end)
    timeout_probe: bool  # sent with a request_timeout it cannot meet
    burst: bool


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0,
                   help="length of the run (no cycle starts after it; the last one runs to its end)")
    p.add_argument("--warm-minutes", type=float, default=5.0, help="warm phase, left out of the acceptance checks")
    p.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--cycle-s", type=float, default=90.0, help="one load phase + one idle gap (seconds)")
    p.add_argument("--idle-s", type=float, default=20.0, help="idle gap at the end of each cycle (seconds)")
    p.add_argument("--rate", type=float, default=1.0, help="Poisson arrival rate of the load phase (requests/s)")
    p.add_argument("--burst", type=int, default=32, help="requests sent at once halfway through each load phase")
    p.add_argument("--n2-share", type=float, default=0.10)
    p.add_argument("--abort-share", type=float, default=0.10)
    p.add_argument("--timeout-share", type=float, default=0.05)
    p.add_argument("--timeout-probe-s", type=float, default=0.3, help="request_timeout of the timeout probes")
    p.add_argument("--max-tokens", type=int, nargs=2, default=(8, 160), metavar=("MIN", "MAX"))
    p.add_argument("--prompt-words", type=int, nargs=2, default=(5, 250), metavar=("MIN", "MAX"))
    p.add_argument("--client-timeout-s", type=float, default=300.0, help="a request unanswered this long fails")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--num-blocks", type=int, default=80, help="server KV pool (small, so that preemption happens)")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=768)
    p.add_argument("--max-queue-len", type=int, default=16, help="server waiting queue: bursts beyond it get 429")
    p.add_argument("--max-queue-wait", type=float, default=60.0)
    p.add_argument("--server-arg", action="append", default=[], help="extra server.py argument (repeatable)")
    p.add_argument("--url", default=None, help="soak this running server instead of starting one")
    p.add_argument("--server-pid", type=int, default=None, help="its process id (with --url)")
    p.add_argument("--startup-timeout-s", type=float, default=900.0)
    p.add_argument("--out", default=None, help="output folder (default: benchmarks/results/<date>-<device>)")
    a = p.parse_args(argv)
    if (a.url is None) != (a.server_pid is None):
        p.error("--url and --server-pid go together")
    if not 0 < a.idle_s < a.cycle_s:
        p.error("--idle-s must be positive and below --cycle-s")
    return a


def server_command(a, port: int) -> list[str]:
    return [sys.executable, str(ROOT / "server.py"), "--port", str(port), "--model", a.model,
            "--num-blocks", str(a.num_blocks), "--max-num-seqs", str(a.max_num_seqs),
            "--max-num-batched-tokens", str(a.max_num_batched_tokens), "--max-model-len", str(a.max_model_len),
            "--max-queue-len", str(a.max_queue_len), "--max-queue-wait", str(a.max_queue_wait),
            "--disable-log-requests", "--log-level", "warning", *a.server_arg]


# ----------------------------------------------------------------------------- the workload

def draw_spec(rng: np.random.Generator, a, burst: bool) -> Spec:
    """One request of the mix (see the module docstring)."""
    abort = rng.random() < a.abort_share
    probe = not abort and rng.random() < a.timeout_share / (1 - a.abort_share)
    return Spec(chat=rng.random() < 0.6, stream=abort or rng.random() < 0.5, n=2 if rng.random() < a.n2_share else 1,
                max_tokens=int(rng.integers(a.max_tokens[0], a.max_tokens[1] + 1)) if not probe else a.max_tokens[1],
                words=int(rng.integers(a.prompt_words[0], a.prompt_words[1] + 1)),
                abort_after=int(rng.integers(2, 7)) if abort else None, timeout_probe=probe, burst=burst)


def request_body(spec: Spec, rng: np.random.Generator, a) -> tuple[str, dict]:
    text = " ".join(rng.choice(WORDS, spec.words))
    body = {"max_tokens": spec.max_tokens, "n": spec.n, "stream": spec.stream, "temperature": 0.8,
            "seed": int(rng.integers(1 << 30))}
    if spec.timeout_probe:
        body.update(request_timeout=a.timeout_probe_s, ignore_eos=True)
    if spec.chat:
        body["messages"] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
        return "/v1/chat/completions", body
    return "/v1/completions", {**body, "prompt": text}


def classify(status: int, code: str | None, spec: Spec) -> str:
    """The outcome of a failed response: expected (429, a probe's 504) or not."""
    if status == 429:
        return "rate_limited"
    if status == 504 or code == "request_timeout":
        return "timeout_expected" if spec.timeout_probe else "server_error"
    return "server_error" if status >= 500 else "client_error"


async def send(client: httpx.AsyncClient, url: str, spec: Spec, body: dict, path: str, t0: float) -> dict:
    """Send one request; its record (times in seconds from the run's start ``t0``)."""
    start = time.monotonic()
    rec = {"t": round(start - t0, 3), **dataclasses.asdict(spec), "status": None, "outcome": "unanswered",
           "ttft_s": None, "t_first_token": None, "error": None}
    try:
        async with client.stream("POST", url + path, json=body) as resp:
            rec["status"] = resp.status_code
            if resp.status_code != 200:
                err = _error_of(await resp.aread())
                rec["error"], rec["outcome"] = err, classify(resp.status_code, (err or {}).get("code"), spec)
            elif not spec.stream:
                json.loads(await resp.aread())
                rec["outcome"] = "ok"
            else:
                await _read_stream(resp, spec, rec, start, t0)
    except (httpx.HTTPError, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["outcome"] = "unanswered"
    rec["e2e_s"] = round(time.monotonic() - start, 4)
    return rec


async def _read_stream(resp: httpx.Response, spec: Spec, rec: dict, start: float, t0: float) -> None:
    events = 0
    async for line in resp.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            if rec["outcome"] == "unanswered":
                rec["outcome"] = "ok"
            return
        obj = json.loads(data)
        if "error" in obj:
            rec["error"] = obj["error"]
            rec["outcome"] = classify(500, obj["error"].get("code"), spec)
            continue  # [DONE] follows
        events += 1
        if rec["ttft_s"] is None and any(_has_text(c) for c in obj.get("choices", [])):
            now = time.monotonic()
            rec["ttft_s"], rec["t_first_token"] = round(now - start, 4), round(now - t0, 3)
        if spec.abort_after is not None and events >= spec.abort_after:
            rec["outcome"] = "client_abort"
            return  # leaving the block closes the connection: the server aborts the request
    rec["error"] = rec["error"] or "the stream ended without [DONE]"
    rec["outcome"] = "unanswered"


def _has_text(choice: dict) -> bool:
    return bool(choice.get("text") or (choice.get("delta") or {}).get("content"))


def _error_of(raw: bytes) -> dict | None:
    try:
        return json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return {"message": raw[:200].decode(errors="replace"), "code": None}


# ----------------------------------------------------------------------------- sampling

def flat_metrics(text: str) -> dict[str, float]:
    """Every ``jaxinfer_*`` sample: ``name{label="v",...}`` (``model_name`` left out) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith("jaxinfer_") or s.name.endswith("_bucket"):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


async def sample(client: httpx.AsyncClient, url: str, proc: psutil.Process, t0: float) -> dict:
    """One sample of the server process and its metrics."""
    metrics = flat_metrics((await client.get(url + "/metrics")).text)
    with proc.oneshot():
        rss, fds, threads = proc.memory_info().rss, proc.num_fds(), proc.num_threads()
    return {"t": round(time.monotonic() - t0, 3), "rss_bytes": rss, "fds": fds, "threads": threads,
            "kv_free": metrics.get("jaxinfer_kv_blocks_free"), "metrics": metrics}


async def sampler(url: str, proc: psutil.Process, t0: float, every_s: float, samples: list, stop: asyncio.Event):
    async with httpx.AsyncClient(timeout=30) as client:
        while not stop.is_set():
            try:
                samples.append(await sample(client, url, proc, t0))
            except (httpx.HTTPError, psutil.Error) as e:
                log.warning("sample failed: %s", e)
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except asyncio.TimeoutError:
                pass


# ----------------------------------------------------------------------------- the run

@dataclasses.dataclass
class Slot:
    """One request of a cycle's load phase: when it is sent and what it is."""

    offset_s: float  # seconds from the start of the load phase
    spec: Spec
    body_seed: int  # seeds its prompt text and sampling seed (`request_body`)


def cycle_pattern(a) -> list[Slot]:
    """The load phase every cycle replays: Poisson arrivals at ``a.rate`` over ``a.cycle_s -
    a.idle_s`` seconds and ``a.burst`` requests at once halfway, each drawn by `draw_spec`;
    a function of ``a.seed`` and the workload flags only (the same list on every call)."""
    rng = np.random.default_rng(a.seed)
    load_s = a.cycle_s - a.idle_s
    slots: list[Slot] = []
    t, burst_done = 0.0, False
    while t < load_s:
        if not burst_done and t >= load_s / 2:
            slots += [Slot(load_s / 2, draw_spec(rng, a, True), int(rng.integers(1 << 31))) for _ in range(a.burst)]
            burst_done = True
        slots.append(Slot(t, draw_spec(rng, a, False), int(rng.integers(1 << 31))))
        t += float(rng.exponential(1 / a.rate))
    return slots


async def load_phase(url: str, a, pattern: list[Slot], t0: float, cycle: int, records: list) -> None:
    """Send ``pattern`` (each slot at its offset from now); wait for every answer. Each
    record gets the ``cycle`` index."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=a.client_timeout_s, limits=limits) as client:
        tasks = []
        for slot in pattern:
            await asyncio.sleep(max(0.0, start + slot.offset_s - time.monotonic()))
            path, body = request_body(slot.spec, np.random.default_rng(slot.body_seed), a)
            tasks.append(asyncio.create_task(send(client, url, slot.spec, body, path, t0)))
        done = await asyncio.gather(*tasks)
    records.extend({**r, "cycle": cycle} for r in done)


async def idle_check(url: str, proc: psutil.Process, t0: float) -> dict:
    async with httpx.AsyncClient(timeout=30) as client:
        s = await sample(client, url, proc, t0)
    return {k: s[k] for k in ("t", "kv_free", "fds", "threads", "rss_bytes")}


async def run(url: str, proc: psutil.Process, a) -> dict:
    """The whole soak against ``url`` (server process ``proc``); the result dict."""
    pattern = cycle_pattern(a)
    t0 = time.monotonic()
    end = t0 + a.minutes * 60
    idle_kv_free = (await idle_check(url, proc, t0))["kv_free"]
    samples, idle_checks, records = [], [], []
    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler(url, proc, t0, a.sample_s, samples, stop))
    cycle = 0
    while time.monotonic() < end:  # whole cycles only: each one replays the same pattern
        start_s = time.monotonic() - t0
        await load_phase(url, a, pattern, t0, cycle, records)
        await asyncio.sleep(a.idle_s)
        idle_checks.append({**await idle_check(url, proc, t0), "cycle": cycle, "start_s": round(start_s, 3)})
        cycle += 1
        done = sum(r["outcome"] == "ok" for r in records)
        log.info("cycle %d at %.1f min: %d requests, %d ok; KV free at idle %s (idle value %s)", cycle,
                 (time.monotonic() - t0) / 60, len(records), done, idle_checks[-1]["kv_free"], idle_kv_free)
    stop.set()
    await sampling
    end_s = time.monotonic() - t0
    add_ttft_percentiles(samples, records)
    verdict = soak_report.evaluate(samples, idle_checks, records, idle_kv_free=idle_kv_free,
                                   warm_s=a.warm_minutes * 60, end_s=end_s)
    verdict["exercised"] = exercised(samples, records)
    return {"duration_s": end_s, "idle_kv_free": idle_kv_free, "acceptance": verdict, "samples": samples,
            "idle_checks": idle_checks, "requests": records}


def add_ttft_percentiles(samples: list[dict], records: list[dict]) -> None:
    """Each sample's ``ttft_p50_ms`` / ``ttft_p99_ms``: of the first tokens since the previous sample."""
    firsts = sorted((r["t_first_token"], r["ttft_s"]) for r in records if r["outcome"] == "ok" and r["ttft_s"])
    prev = -math.inf
    for s in samples:
        window = [v * 1000 for t, v in firsts if prev < t <= s["t"]]
        s["ttft_p50_ms"] = soak_report.percentile(window, 50)
        s["ttft_p99_ms"] = soak_report.percentile(window, 99)
        prev = s["t"]


def exercised(samples: list[dict], records: list[dict]) -> dict:
    """Whether the run did what the mix is for (429s, preemptions, aborts, timeouts, cache hits)."""
    last = samples[-1]["metrics"] if samples else {}
    counts = {o: sum(r["outcome"] == o for r in records) for o in ("rate_limited", "client_abort", "timeout_expected")}
    return {**counts, "n2_requests": sum(r["n"] == 2 for r in records),
            "preemptions": last.get("jaxinfer_preemptions_total"),
            "prefix_cache_hits": last.get("jaxinfer_prefix_cache_hits_total"),
            "streamed": sum(r["stream"] for r in records), "requests": len(records)}


def main(argv=None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"{datetime.date.today()}-{device_label()}"
    out.mkdir(parents=True, exist_ok=True)
    server = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the server we started
    if a.url is None:
        port = free_port()
        a.url = f"http://127.0.0.1:{port}"
        server_log = open(out / "soak-server.log", "w")
        server = subprocess.Popen(server_command(a, port), cwd=ROOT, stdout=server_log, stderr=subprocess.STDOUT)
        a.server_pid = server.pid
        log.info("starting %s (log: %s)", " ".join(server_command(a, port)[1:]), out / "soak-server.log")
        wait_healthy(a.url, server, a.startup_timeout_s)
    try:
        result = asyncio.run(run(a.url, psutil.Process(a.server_pid), a))
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
    meta = metadata.collect(a.model, {"url": a.url, "device": device_label()})
    doc = {"benchmark": "soak", "settings": vars(a), "metadata": meta, **result}
    (out / "soak.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    soak_report.plot(out / "soak.png", result["samples"], result["idle_checks"], warm_s=a.warm_minutes * 60,
                     title=f"soak: {a.model}, {a.minutes:g} min on {device_label()}",
                     ttft_check=result["acceptance"]["checks"]["ttft_p99_stable"])
    verdict = result["acceptance"]
    for name, check in verdict["checks"].items():
        log.info("%-24s %s", name, "pass" if check["pass"] else f"FAIL {json.dumps(check, default=str)[:300]}")
    log.info("outcomes %s; exercised %s", verdict["outcomes"], verdict["exercised"])
    log.info("wrote %s and %s", out / "soak.json", out / "soak.png")
    return 0 if verdict["all_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
