"""Consistent hashing versus round robin in front of several instances, in one run.

Workload (`jaxinfer.bench.chat_workload`): ``--sessions`` multi-turn chats at once, each a
sequence of ``--turns`` chat requests whose prompt is a shared system prompt, the whole
history so far (earlier user messages and the model's own answers) and a new user message.
Its shape is a preset (``--preset``: ``chat``, the default, history-dominated with think time
and a KV pool of about ``--cache-sessions`` sessions per instance; ``travel6``, the first
configuration measured) with any shape flag on top. With consistent hashing on
``X-Session-Id`` each turn lands on the instance that served the previous one, whose prefix
cache holds the history; with round robin it usually does not. For each routing mode the
script starts a fresh cluster (`jaxinfer.cluster.launcher.Cluster`: ``--instances`` servers with prefix
caching on, HAProxy in front) and measures:

* prefix-cache hit rate, token-weighted: the increase of ``jaxinfer_prefix_cache_hits_total``
  (prompt tokens found in the cache, whole blocks) over that of
  ``jaxinfer_prefix_cache_queries_total`` (prompt tokens of every request), both summed over
  the instances; the miss tokens (queries - hits: the prompt tokens that had to be
  prefilled), which is what hashing saves; the same rate from the clients' side
  (``usage.prompt_tokens_details.cached_tokens`` over ``usage.prompt_tokens``) as a check;
* TTFT p50 / p90 per request, from sending the request to the first streamed content token;
* requests per instance, and how many instances each session visited.

Writes one JSON file (default ``benchmarks/results/cluster-<date>-<device>.json``) with the
workload's shape (asked for and measured), both modes, the ratios round robin / hashing, and
whether hashing reached 2x on hit rate and TTFT p50.

Usage: python benchmarks/cluster_bench.py [--preset chat|travel6] [--instances 3] [--sessions N]
       [--turns N] [--system-tokens N] [--user-tokens N] [--answer-tokens N] [--think-time S]
       [--cache-sessions N] [--modes hash roundrobin] [--out PATH] [-- server flags]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import datetime
import json
import socket
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import device_label  # noqa: E402

from jaxinfer.bench import chat_workload as cw  # noqa: E402
from jaxinfer.bench import metadata  # noqa: E402
from jaxinfer.cluster.launcher import Cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BLOCK_SIZE = 16  # server.py's --block-size default


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default=cw.DEFAULT_PRESET, choices=sorted(cw.PRESETS),
                   help="workload shape; the flags below override its fields (see jaxinfer/bench/chat_workload.py)")
    p.add_argument("--instances", type=int, default=3)
    shape = p.add_argument_group("workload shape (default: the preset's)")
    shape.add_argument("--sessions", type=int, default=None, help="conversations at once")
    shape.add_argument("--turns", type=int, default=None, help="requests per conversation")
    shape.add_argument("--system-tokens", type=int, default=None,
                       help="tokens of the shared system prompt (0: the built-in 40-token text)")
    shape.add_argument("--user-tokens", type=int, default=None,
                       help="tokens of every user message (0: the bare question, 5-16 tokens)")
    shape.add_argument("--answer-tokens", "--max-tokens", dest="answer_tokens", type=int, default=None,
                       help="max_tokens of every answer")
    shape.add_argument("--think-time", dest="think_time_s", type=float, default=None,
                       help="mean seconds between an answer and the next message (0: none, all start at once)")
    shape.add_argument("--cache-sessions", type=float, default=None,
                       help="each instance's KV pool holds this many sessions' longest context "
                            "(0: the server's default pool)")
    p.add_argument("--seed", type=int, default=0, help="seed of the think times")
    p.add_argument("--modes", nargs="+", default=["hash", "roundrobin"], choices=["hash", "roundrobin"])
    p.add_argument("--model", default="smollm2-135m-instruct", help="served model (also passed as --model)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json that sizes the messages (default: weights/<model>/tokenizer.json)")
    p.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds for an instance to warm up")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/cluster-<date>-<device>.json)")
    args, server_args = p.parse_known_args(argv)
    args.server_args = [a for a in server_args if a != "--"]
    if args.cache_sessions == 0:
        args.cache_sessions = None
        args.default_pool = True
    else:
        args.default_pool = False
    try:
        args.shape = shape_from_args(args)
    except ValueError as e:
        p.error(str(e))
    if args.shape.cache_sessions is not None and "--num-blocks" in args.server_args:
        p.error("--num-blocks among the server flags conflicts with --cache-sessions; pass --cache-sessions 0")
    return args


def shape_from_args(args) -> cw.ChatShape:
    """The preset with the shape flags given on the command line on top (``--cache-sessions 0``:
    the server's default pool)."""
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(cw.ChatShape)}
    shape = cw.resolve_shape(args.preset, **fields)
    return dataclasses.replace(shape, cache_sessions=None) if getattr(args, "default_pool", False) else shape


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float | None:
    """numpy's (linear) percentile, None for no values."""
    return float(np.percentile(values, q)) if values else None


def server_flag(server_args: list[str], name: str, default: int) -> int:
    """The integer value of ``name`` among the server flags (``--x V`` or ``--x=V``), else ``default``."""
    for i, a in enumerate(server_args):
        if a == name and i + 1 < len(server_args):
            return int(server_args[i + 1])
        if a.startswith(name + "="):
            return int(a.split("=", 1)[1])
    return default


@dataclasses.dataclass
class Texts:
    """The workload's messages and its KV pool, fixed before any cluster starts."""
    system: str
    users: list[list[str]]  # [session][turn]
    think: np.ndarray  # (sessions, turns) seconds
    system_len: int
    user_lens: list[list[int]]
    num_blocks: int | None


def build_texts(shape: cw.ChatShape, codec: cw.Codec, block_size: int, seed: int) -> Texts:
    system = cw.system_prompt(shape, codec)
    users = [[cw.user_message(shape, s, t, codec) for t in range(shape.turns)] for s in range(shape.sessions)]
    user_lens = [[len(codec.encode(u)) for u in row] for row in users]
    system_len = len(codec.encode(system))
    longest = max(cw.longest_context_tokens(shape, system_len, row) for row in user_lens)
    return Texts(system, users, cw.think_times(shape, seed), system_len, user_lens,
                 cw.kv_pool_blocks(shape, longest, block_size))


async def chat_turn(http: httpx.AsyncClient, session: str, messages: list[dict], a) -> dict:
    """One streamed chat request: TTFT (s), answer text, usage and the answering instance; or
    ``{"error": ...}`` for a non-200 status or a connection that failed (its session stops)."""
    try:
        return await _chat_turn(http, session, messages, a)
    except httpx.HTTPError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


async def _chat_turn(http: httpx.AsyncClient, session: str, messages: list[dict], a) -> dict:
    body = {"model": a.model, "messages": messages, "max_tokens": a.shape.answer_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, text, usage = None, "", None
    async with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": session}) as r:
        if r.status_code != 200:
            await r.aread()
            return {"error": f"{r.status_code} {r.text[:200]}"}
        instance = r.headers.get("x-jaxinfer-instance")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    text += piece
    return {"ttft_s": ttft, "text": text, "usage": usage, "instance": instance}


async def run_session(http: httpx.AsyncClient, index: int, texts: Texts, a) -> list[dict]:
    session = f"chat-{index}"
    messages = [{"role": "system", "content": texts.system}]
    out = []
    for turn in range(a.shape.turns):
        await asyncio.sleep(texts.think[index, turn])
        messages.append({"role": "user", "content": texts.users[index][turn]})
        result = await chat_turn(http, session, messages, a)
        out.append({"session": session, "turn": turn, **result})
        if "error" in result:
            break
        messages.append({"role": "assistant", "content": result["text"]})
    return out


def read_metrics(cluster: Cluster) -> list[dict]:
    """Every instance's ``jaxinfer_*`` metrics (`metadata.parse_metrics`), in instance order."""
    return [metadata.server_state(inst.url)["metrics"] or {} for inst in cluster.instances]


async def workload(url: str, texts: Texts, a) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800.0)) as http:
        sessions = await asyncio.gather(*(run_session(http, i, texts, a) for i in range(a.shape.sessions)))
    return [turn for s in sessions for turn in s]


def summarize(turns: list[dict], cache: dict) -> dict:
    """One mode's figures from its turns (`chat_turn` results) and `cw.cache_figures`."""
    ok = [t for t in turns if "error" not in t]
    ttfts = [t["ttft_s"] for t in ok if t["ttft_s"] is not None]
    usages = [t["usage"] for t in ok if t["usage"]]
    prompt = sum(u["prompt_tokens"] for u in usages)
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usages)
    per_session = collections.defaultdict(set)
    for t in ok:
        per_session[t["session"]].add(t["instance"])
    return {"requests": len(turns), "errors": [t["error"] for t in turns if "error" in t],
            "ttft_s": {"p50": percentile(ttfts, 50), "p90": percentile(ttfts, 90),
                       "mean": statistics.fmean(ttfts) if ttfts else None},
            "hit_rate_metrics": cache["hit_rate"], "hit_rate_usage": cached / prompt if prompt else None,
            "prefix_cache_tokens": {"hits": cache["hit_tokens"], "queries": cache["query_tokens"],
                                    "misses": cache["miss_tokens"], "evicted_blocks": cache["evicted_blocks"]},
            "prompt_tokens": {"mean": statistics.fmean(u["prompt_tokens"] for u in usages) if usages else None,
                              "max": max((u["prompt_tokens"] for u in usages), default=None)},
            "answer_tokens_mean": statistics.fmean(u["completion_tokens"] for u in usages) if usages else None,
            "requests_per_instance": dict(sorted(collections.Counter(t["instance"] for t in ok).items())),
            "instances_per_session_mean": statistics.fmean(len(v) for v in per_session.values()) if per_session
            else None}


def run_mode(mode: str, texts: Texts, a, run_dir: Path) -> dict:
    """A fresh cluster with routing ``mode``; the workload; its figures."""
    pool = ["--num-blocks", str(texts.num_blocks)] if texts.num_blocks else []
    server_args = ["--model", a.model, "--prefix-caching", "--disable-log-requests", *pool, *a.server_args]
    print(f"== {mode}: starting {a.instances} instances", flush=True)
    ports = [free_port() for _ in range(a.instances)]
    with Cluster(a.instances, server_args, port=free_port(), ports=ports, run_dir=run_dir / mode, balance=mode,
                 ready_timeout=a.ready_timeout, say=lambda m: print(m, flush=True)) as cluster:
        before = read_metrics(cluster)
        t0 = time.monotonic()
        turns = asyncio.run(workload(cluster.url, texts, a))
        elapsed = time.monotonic() - t0
        after = read_metrics(cluster)
    return {**summarize(turns, cw.cache_figures(before, after)), "server_means": cw.server_phase_means(before, after),
            "elapsed_s": elapsed}


def ratios(h: dict, rr: dict) -> dict:
    """Round robin over hashing for TTFT p50 and miss tokens, hashing over round robin for the
    hit rate, and whether the first and last reach 2."""
    def over(x, y):
        return x / y if x and y else None
    ttft = over(rr["ttft_s"]["p50"], h["ttft_s"]["p50"])
    hits = over(h["hit_rate_metrics"], rr["hit_rate_metrics"])
    return {"ttft_p50_roundrobin_over_hash": ttft, "hit_rate_hash_over_roundrobin": hits,
            "miss_tokens_roundrobin_over_hash": over(rr["prefix_cache_tokens"]["misses"],
                                                     h["prefix_cache_tokens"]["misses"]),
            "hash_ttft_p50_at_least_2x_lower": ttft is not None and ttft >= 2,
            "hash_hit_rate_at_least_2x": hits is not None and hits >= 2}


def main(argv=None) -> dict:
    a = parse_args(argv)
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / (
        f"cluster-{datetime.date.today()}-{device_label()}.json")
    run_dir = out.parent / (out.stem + "-logs")
    codec = cw.TokenizerCodec(a.tokenizer or ROOT / "weights" / a.model / "tokenizer.json")
    texts = build_texts(a.shape, codec, server_flag(a.server_args, "--block-size", DEFAULT_BLOCK_SIZE), a.seed)
    user_lens = [n for row in texts.user_lens for n in row]
    settings = {"preset": a.preset, "shape": dataclasses.asdict(a.shape), "instances": a.instances, "seed": a.seed,
                "modes": a.modes, "model": a.model, "server_args": a.server_args,
                "num_blocks_per_instance": texts.num_blocks,
                "measured": {"system_tokens": texts.system_len, "user_tokens_mean": statistics.fmean(user_lens),
                             "user_tokens_max": max(user_lens),
                             "think_time_s_mean": float(texts.think[:, 1:].mean()) if a.shape.turns > 1 else 0.0}}
    print(json.dumps(settings["shape"]), "num_blocks", texts.num_blocks, json.dumps(settings["measured"]), flush=True)
    result = {"metadata": metadata.collect(a.model, {"device": device_label(), "flags": a.server_args}),
              "settings": settings, "modes": {}}
    for mode in a.modes:
        m = result["modes"][mode] = run_mode(mode, texts, a, run_dir)
        print(mode, json.dumps(m["ttft_s"]), "hit rate", m["hit_rate_metrics"], "misses",
              m["prefix_cache_tokens"]["misses"], "evicted blocks", m["prefix_cache_tokens"]["evicted_blocks"],
              "server means", json.dumps(m["server_means"]), flush=True)
    if {"hash", "roundrobin"} <= set(result["modes"]):
        result["ratios"] = ratios(result["modes"]["hash"], result["modes"]["roundrobin"])
        print(json.dumps(result["ratios"], indent=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
