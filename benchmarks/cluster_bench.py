"""Consistent hashing versus round robin in front of several instances, in one run.

Workload: ``--sessions`` multi-turn chats run at once, each a sequence of ``--turns`` chat
requests whose prompt is a shared system prompt, the whole history so far (earlier questions
and the model's own answers) and a new question. With consistent hashing on ``X-Session-Id``
each turn lands on the instance that served the previous one, whose prefix cache holds the
history; with round robin it usually does not. For each routing mode the script starts a
fresh cluster (`jaxinfer.cluster.Cluster`: ``--instances`` servers with prefix caching on,
HAProxy in front) and measures:

* prefix-cache hit rate: prompt tokens found in the cache / prompt tokens looked up, summed
  over the instances' ``jaxinfer_prefix_cache_{hits,queries}_total`` (before and after), and
  the same from the clients' side (``usage.prompt_tokens_details.cached_tokens``);
* TTFT p50 / p90 per request, from sending the request to the first streamed content token.

Writes one JSON file (default ``benchmarks/results/cluster-<date>-<device>.json``) with both
modes, the ratios round robin / hashing, and whether hashing reached 2x on both.

Usage: python benchmarks/cluster_bench.py [--instances 3] [--sessions 24] [--turns 6]
       [--max-tokens 48] [--modes hash roundrobin] [--out PATH] [-- server flags]
"""
from __future__ import annotations

import argparse
import asyncio
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

from compare import device_label  # noqa: E402

from jaxinfer.bench import metadata  # noqa: E402
from jaxinfer.cluster import Cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = ("You are a concise assistant for a travel agency. Answer in two or three sentences, name concrete "
          "places, and never invent prices. If a question is unclear, say what you would need to know.")
TOPICS = ["Lisbon", "Kyoto", "Patagonia", "Iceland", "Morocco", "Vancouver", "Crete", "Hanoi"]
QUESTIONS = ["I am planning a trip to {topic}. When is the best season to go?",
             "What should I see there in three days?",
             "Which neighbourhood is good to stay in?",
             "How do I get around without a car?",
             "What local food should I try?",
             "Is it a good place for a family with children?",
             "What should I pack?",
             "Give me one day trip from there."]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=48, help="answer length of every turn")
    p.add_argument("--modes", nargs="+", default=["hash", "roundrobin"], choices=["hash", "roundrobin"])
    p.add_argument("--model", default="smollm2-135m-instruct", help="served model (also passed as --model)")
    p.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds for an instance to warm up")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/cluster-<date>-<device>.json)")
    args, server_args = p.parse_known_args(argv)
    args.server_args = [a for a in server_args if a != "--"]
    return args


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float | None:
    """numpy's (linear) percentile, None for no values."""
    return float(np.percentile(values, q)) if values else None


async def chat_turn(http: httpx.AsyncClient, session: str, messages: list[dict], a) -> dict:
    """One streamed chat request: TTFT (s), answer text, usage and the answering instance."""
    body = {"model": a.model, "messages": messages, "max_tokens": a.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
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


async def run_session(http: httpx.AsyncClient, index: int, a) -> list[dict]:
    session = f"chat-{index}"
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for turn in range(a.turns):
        question = QUESTIONS[turn % len(QUESTIONS)].format(topic=TOPICS[index % len(TOPICS)])
        messages.append({"role": "user", "content": f"{question} (traveller {index})" if turn == 0 else question})
        result = await chat_turn(http, session, messages, a)
        out.append({"session": session, "turn": turn, **result})
        if "error" in result:
            break
        messages.append({"role": "assistant", "content": result["text"]})
    return out


def cache_counters(cluster: Cluster) -> tuple[float, float]:
    """(hits, queries) in prompt tokens, summed over the instances' /metrics."""
    hits = queries = 0.0
    for inst in cluster.instances:
        m = metadata.server_state(inst.url)["metrics"] or {}
        hits += m.get("prefix_cache_hits_total", 0.0)
        queries += m.get("prefix_cache_queries_total", 0.0)
    return hits, queries


async def workload(url: str, a) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800.0)) as http:
        sessions = await asyncio.gather(*(run_session(http, i, a) for i in range(a.sessions)))
    return [turn for s in sessions for turn in s]


def run_mode(mode: str, a, run_dir: Path) -> dict:
    """A fresh cluster with routing ``mode``; the workload; its figures."""
    server_args = ["--model", a.model, "--prefix-caching", "--disable-log-requests", *a.server_args]
    print(f"== {mode}: starting {a.instances} instances", flush=True)
    ports = [free_port() for _ in range(a.instances)]
    with Cluster(a.instances, server_args, port=free_port(), ports=ports, run_dir=run_dir / mode, balance=mode,
                 ready_timeout=a.ready_timeout, say=lambda m: print(m, flush=True)) as cluster:
        h0, q0 = cache_counters(cluster)
        t0 = time.monotonic()
        turns = asyncio.run(workload(cluster.url, a))
        elapsed = time.monotonic() - t0
        h1, q1 = cache_counters(cluster)
    ok = [t for t in turns if "error" not in t]
    ttfts = [t["ttft_s"] for t in ok if t["ttft_s"] is not None]
    prompt = sum(t["usage"]["prompt_tokens"] for t in ok if t["usage"])
    cached = sum((t["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) for t in ok if t["usage"])
    per_session = {}
    for t in ok:
        per_session.setdefault(t["session"], set()).add(t["instance"])
    return {"requests": len(turns), "errors": [t["error"] for t in turns if "error" in t], "elapsed_s": elapsed,
            "ttft_s": {"p50": percentile(ttfts, 50), "p90": percentile(ttfts, 90), "mean": statistics.fmean(ttfts)
                       if ttfts else None},
            "hit_rate_metrics": (h1 - h0) / (q1 - q0) if q1 > q0 else None,
            "hit_rate_usage": cached / prompt if prompt else None,
            "prefix_cache_tokens": {"hits": h1 - h0, "queries": q1 - q0},
            "instances_per_session_mean": statistics.fmean(len(v) for v in per_session.values()) if per_session
            else None}


def main(argv=None) -> dict:
    a = parse_args(argv)
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / (
        f"cluster-{datetime.date.today()}-{device_label()}.json")
    run_dir = out.parent / (out.stem + "-logs")
    settings = {k: v for k, v in vars(a).items() if k != "out"}
    result = {"metadata": metadata.collect(a.model, {"device": device_label(), "flags": a.server_args}),
              "settings": settings, "modes": {}}
    for mode in a.modes:
        result["modes"][mode] = run_mode(mode, a, run_dir)
        print(json.dumps(result["modes"][mode]["ttft_s"]), result["modes"][mode]["hit_rate_metrics"], flush=True)
    if {"hash", "roundrobin"} <= set(result["modes"]):
        h, rr = result["modes"]["hash"], result["modes"]["roundrobin"]
        ttft = rr["ttft_s"]["p50"] / h["ttft_s"]["p50"] if h["ttft_s"]["p50"] and rr["ttft_s"]["p50"] else None
        hits = h["hit_rate_metrics"] / rr["hit_rate_metrics"] if rr["hit_rate_metrics"] else None
        result["ratios"] = {"ttft_p50_roundrobin_over_hash": ttft, "hit_rate_hash_over_roundrobin": hits,
                            "hash_ttft_p50_at_least_2x_lower": ttft is not None and ttft >= 2,
                            "hash_hit_rate_at_least_2x": hits is not None and hits >= 2}
        print(json.dumps(result["ratios"], indent=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
