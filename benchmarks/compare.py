"""The serving comparison: jaxinfer (continuous batching) vs jaxinfer (static batching,
same engine, same KV budget) vs Hugging Face transformers (static batches), on this machine.

Scenarios (closed loop; prompts are random token ids; ``ignore_eos`` so lengths are exact):
  1. ``fixed``: ``--concurrency`` (32) clients, 512-token prompts, 256-token outputs.
  2. ``sharegpt``: same concurrency, ShareGPT-like lognormal lengths (see
     `jaxinfer.bench.workloads`), prompts <= 512 and outputs <= 511 tokens.
  3. ``overload``: 4x the concurrency the KV pool can hold, scenario 1's lengths.
Queues: scenarios 1-2 let every client wait (``--timeout-s``); overload keeps a short queue
(``--overload-queue-len``, ``--max-queue-wait``) so excess clients get 429 at once.
Both jaxinfer modes get the same KV pool: ``--num-blocks`` = enough blocks for
``concurrency`` requests of 512 + 256 tokens (+ the null block), ``max_model_len`` 1024.
Static batching reserves ``max_model_len`` per member, so fewer members fit: the rest
fail (HTTP 503). The transformers server runs scenario 1 only by default (its static
batches are the slowest part; ``--hf-scenarios`` changes that).

Every (system, scenario) gets a fresh server subprocess on 127.0.0.1 (free port), so the
server's KV fragmentation gauge covers that scenario only (its warm-up requests included).
Writes ``benchmarks/results/<date>-<device>/``: ``compare.json`` (per scenario and system:
output_throughput_tok_s, ttft_ms / tpot_ms / itl_ms / e2el_ms with mean, p50, p95, p99,
kv_fragmentation, request counts by outcome), ``compare.md`` (README table), per-run
JSON / markdown / CDF plots under ``runs/`` and one CDF plot per scenario.

The request counts (``--num-requests``) are scaled down from the brief's 128 so the
whole comparison fits in about 20 minutes on the 2-core development CPU; the metadata
says so (``scaled_down``). Full run: ``make bench`` or
``python benchmarks/compare.py``; a smoke run: ``python benchmarks/compare.py --quick``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from jaxinfer.bench import load, metadata, report, workloads
from jaxinfer.bench.serve import run_benchmark
from jaxinfer.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
BRIEF_NUM_REQUESTS = 128
SYSTEMS = ("jaxinfer", "jaxinfer-static", "hf-transformers")
SCENARIOS = ("fixed", "sharegpt", "overload")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def queue_limits(scenario: str, a) -> tuple[int, float]:
    """(max queue length, max queue wait s). Scenarios 1-2 queue every client (nobody should
    be turned away at the designed load); overload keeps a short queue so excess clients get
    429 + Retry-After at once instead of waiting, which keeps admitted requests' TTFT bounded."""
    if scenario == "overload":
        return a.overload_queue_len, a.max_queue_wait
    return a.max_queue_len, a.timeout_s


def server_command(system: str, port: int, a, scenario: str = "fixed") -> list[str]:
    """The command line that starts ``system`` on ``port`` (same model and limits for both jaxinfer modes)."""
    queue_len, queue_wait = queue_limits(scenario, a)
    if system == "hf-transformers":
        return [sys.executable, str(ROOT / "benchmarks" / "hf_server.py"), "--port", str(port),
                "--max-batch-size", str(a.concurrency), "--batch-timeout-s", str(a.batch_timeout_s),
                "--served-model-name", a.model, "--max-queue-len", str(queue_len)] + (
                    ["--threads", str(a.hf_threads)] if a.hf_threads else [])
    return [sys.executable, str(a.server_script), "--port", str(port), "--model", a.model,
            "--max-num-seqs", str(a.concurrency), "--max-num-batched-tokens", str(a.max_num_batched_tokens),
            "--max-model-len", str(a.max_model_len), "--num-blocks", str(a.num_blocks),
            "--max-queue-len", str(queue_len), "--max-queue-wait", str(queue_wait),
            "--shutdown-timeout", "5", "--log-level", "warning",
            "--scheduler", "static" if system == "jaxinfer-static" else "continuous"]


@contextlib.contextmanager
def running_server(cmd: list[str], log_path: Path, startup_timeout_s: float):
    """Start a server subprocess, wait until ``GET /health`` is 200, yield its base URL,
    then SIGTERM it (SIGKILL after 30 s)."""
    port = int(cmd[cmd.index("--port") + 1])
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc, startup_timeout_s)
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> float:
    """Seconds until ``/health`` answered 200. Raises if the process died or time ran out."""
    t0 = time.monotonic()
    with httpx.Client(timeout=5.0) as c:
        while time.monotonic() - t0 < timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with status {proc.returncode} during start-up")
            with contextlib.suppress(httpx.HTTPError):
                if c.get(url + "/health").status_code == 200:
                    return time.monotonic() - t0
            time.sleep(1.0)
    raise TimeoutError(f"{url} not healthy after {timeout_s:g} s")


def scenario_setup(name: str, a) -> tuple[workloads.WorkloadConfig, int]:
    """(workload, closed-loop concurrency) of a scenario."""
    if name == "sharegpt":
        wl = workloads.WorkloadConfig(name="sharegpt", num_requests=a.num_requests, max_input_len=a.max_model_len // 2,
                                      max_output_len=a.max_model_len // 2 - 1, seed=a.seed)
        return wl, a.concurrency
    wl = workloads.WorkloadConfig(name="fixed", num_requests=a.num_requests * (2 if name == "overload" else 1),
                                  input_len=a.input_len, output_len=a.output_len, seed=a.seed)
    return wl, a.concurrency * (4 if name == "overload" else 1)


def system_entry(summary: dict) -> dict:
    """The compare.json fields of one (scenario, system)."""
    def pick(d: dict) -> dict:
        return {"mean": d["mean"], "p50": d["median"], "median": d["median"], "p95": d["p95"], "p99": d["p99"]}

    return {"output_throughput_tok_s": summary["output_throughput_tok_s"],
            "request_throughput_req_s": summary["request_throughput_req_s"],
            "goodput_req_s": summary["goodput_req_s"],
            **{k: pick(summary[k]) for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")},
            "kv_fragmentation": summary.get("kv_fragmentation"), "counts": summary["counts"],
            "duration_s": summary["duration_s"]}


def device_label() -> str:
    """``<gpu-name>`` from nvidia-smi, else ``cpu<cores>``."""
    gpu = gpu_info()
    return gpu["name"].lower().replace(" ", "-") if gpu else f"cpu{os.cpu_count()}"


def gpu_info() -> dict | None:
    """The first GPU's name and memory (MiB) from nvidia-smi, or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    with contextlib.suppress(subprocess.CalledProcessError, OSError, ValueError):
        line = subprocess.check_output(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                                       text=True).splitlines()[0]
        name, mem = (x.strip() for x in line.split(","))
        return {"name": name, "memory_mib": int(mem)}
    return None


def system_info(system: str, cmd: list[str]) -> dict:
    """What the metadata records about a server under test."""
    if system == "hf-transformers":
        engine = {"backend": "transformers generate (torch, eager)", "dtype": "float32", "batching": "static"}
    else:
        engine = {"backend": "jaxinfer (attention: server default, pallas on GPU / xla otherwise)", "dtype": "float32",
                  "batching": "static" if system == "jaxinfer-static" else "continuous"}
    return {"system": system, "command": " ".join(cmd[1:]), "device": device_label(), "gpu": gpu_info(), **engine}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    p.add_argument("--hf-scenarios", nargs="+", default=["fixed"], choices=SCENARIOS)
    p.add_argument("--concurrency", type=int, default=32, help="clients; also max_num_seqs / max batch size")
    p.add_argument("--num-requests", type=int, default=64,
                   help=f"measured requests per scenario (overload: twice this); the brief asks {BRIEF_NUM_REQUESTS}")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--warmup-requests", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-queue-len", type=int, default=256)
    p.add_argument("--max-queue-wait", type=float, default=30.0,
                   help="jaxinfer, overload scenario: seconds queued before 429 (scenarios 1-2 wait --timeout-s)")
    p.add_argument("--overload-queue-len", type=int, default=8, help="overload scenario: waiting requests before 429")
    p.add_argument("--overload-max-retries", type=int, default=0,
                   help="overload scenario: clients resend a 429 after its Retry-After up to this many times "
                        "(0, the default of the committed results: a 429 is final)")
    p.add_argument("--batch-timeout-s", type=float, default=0.1, help="hf-transformers: batch formation wait")
    p.add_argument("--hf-threads", type=int, default=None, help="hf-transformers: torch threads (default torch's)")
    p.add_argument("--slo-ttft-ms", type=float, default=10_000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=500.0)
    p.add_argument("--timeout-s", type=float, default=900.0, help="client-side limit per request")
    p.add_argument("--startup-timeout-s", type=float, default=900.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-script", type=Path, default=ROOT / "server.py", help="jaxinfer server entry point")
    p.add_argument("--out", default=None, help="default benchmarks/results/<date>-<device>")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 4 clients, 8 requests, 64-token prompts, 16-token outputs")
    a = p.parse_args(argv)
    if a.quick:
        a.concurrency, a.num_requests, a.input_len, a.output_len, a.warmup_requests = 4, 8, 64, 16, 1
        a.max_model_len, a.max_num_batched_tokens = 256, 128
    a.blocks_per_request = math.ceil((a.input_len + a.output_len) / 16)
    a.num_blocks = a.concurrency * a.blocks_per_request + 1  # + the null block
    return a


def main(argv=None) -> dict:
    a = parse_args(argv)
    t_start = time.monotonic()
    name = f"{datetime.date.today()}-{device_label()}{'-quick' if a.quick else ''}"
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / name
    kv_block_bytes = 16 * ModelConfig.from_dir(ROOT / "weights" / a.model).kv_bytes_per_token  # float32
    meta = metadata.collect(a.model, {"device": device_label(), "gpu": gpu_info()})
    meta.update(settings={k: v for k, v in vars(a).items()},
                kv_budget={"num_blocks": a.num_blocks, "bytes_float32": (a.num_blocks - 1) * kv_block_bytes,
                           "holds": f"{a.concurrency} requests of {a.input_len}+{a.output_len} tokens"},
                scaled_down={"brief_num_requests": BRIEF_NUM_REQUESTS, "num_requests": a.num_requests,
                             "overload_num_requests": 2 * a.num_requests,
                             "why": "the brief's 128 requests per scenario do not fit in 20 minutes on this CPU"}
                if a.num_requests < BRIEF_NUM_REQUESTS else None)
    result = {"metadata": meta, "scenarios": {}}
    for scen in a.scenarios:
        wl, conc = scenario_setup(scen, a)
        per_system, cdf_runs = {}, []
        for system in a.systems:
            if system == "hf-transformers" and scen not in a.hf_scenarios:
                continue
            port = free_port()
            cmd = server_command(system, port, a, scen)
            label = f"{scen}-{system}"
            print(f"== {label}: {conc} clients, {wl.num_requests} requests", flush=True)
            with running_server(cmd, out / "logs" / f"{label}.log", a.startup_timeout_s) as url:
                retries = a.overload_max_retries if scen == "overload" else 0
                cfg = load.LoadConfig(url, a.model, concurrency=conc, timeout_s=a.timeout_s, seed=a.seed,
                                      max_retries=retries)
                info = system_info(system, cmd)
                run = run_benchmark(cfg, wl, label=label, out_dir=out / "runs", warmup_requests=a.warmup_requests,
                                    slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms, server_info=info)
            per_system[system] = {"concurrency": conc, **system_entry(run["summary"])}
            cdf_runs.append((system, run["summary"], label))
            print(report.markdown_table([(label, run["summary"])]), flush=True)
        if per_system:
            result["scenarios"][scen] = per_system
            _write_scenario_plot(out, scen, cdf_runs)
    meta["elapsed_s"] = time.monotonic() - t_start
    report.write_json(out / "compare.json", result)
    (out / "compare.md").write_text(compare_markdown(result))
    print((out / "compare.md").read_text())
    print(f"wrote {out} in {meta['elapsed_s']:.0f} s")
    return result


def _write_scenario_plot(out: Path, scen: str, runs) -> None:
    """One CDF figure per scenario, every system as a line (from the per-run JSON files)."""
    from jaxinfer.bench.client import RequestResult

    series = []
    for system, _, label in runs:
        raw = json.loads((out / "runs" / f"{label}.json").read_text())["requests"]
        series.append((system, [RequestResult(**{k: v for k, v in r.items() if k != "tpot"}) for r in raw]))
    if series:
        report.plot_cdfs(out / f"{scen}_cdf.png", series)


def compare_markdown(result: dict) -> str:
    """The README table: one section per scenario, one row per system."""
    md = [f"Measured {result['metadata']['date']} on {result['metadata']['host']['cpu']} "
          f"({result['metadata']['host']['cpu_count']} cores), commit "
          f"{(result['metadata']['git']['commit'] or 'unknown')[:10]}.\n"]
    if result["metadata"].get("scaled_down"):
        s = result["metadata"]["scaled_down"]
        md.append(f"Scaled down: {s['num_requests']} requests per scenario ({s['overload_num_requests']} for overload) "
                  f"instead of {s['brief_num_requests']}: {s['why']}.\n")
    for scen, systems in result["scenarios"].items():
        md.append(f"\n### {scen}\n\n")
        rows = [(f"{name} (c={e['concurrency']})", _as_summary(e)) for name, e in systems.items()]
        md.append(report.markdown_table(rows))
    return "".join(md)


def _as_summary(e: dict) -> dict:
    """A compare.json entry in the shape `report.markdown_table` reads."""
    return {**e, "completed": e["counts"]["ok"]}


if __name__ == "__main__":
    main()
