"""Prefix caching on vs off, side by side in one run (issue 7).

Scenarios (closed loop, ``--concurrency`` clients, ``ignore_eos``):
  * ``shared``: every prompt = one shared ``--prefix-len``-token prefix (a long system
    prompt) + a unique ``--suffix-len``-token suffix; the gain shows in TTFT.
  * ``unshared``: random ``--input-len``-token prompts that share nothing; measures the
    cost of hashing and bookkeeping (throughput should stay within ~3% of caching off).
Each (scenario, setting) gets a fresh ``server.py`` (``--prefix-caching`` /
``--no-prefix-caching``) on a free 127.0.0.1 port with the same limits and KV pool.
Writes ``benchmarks/results/<date>-<device>-prefix-cache/``: ``prefix_cache.json``
(per scenario and setting: TTFT / TPOT / E2E percentiles, throughputs, cached-token
counters from /metrics) and ``prefix_cache.md``.

Usage: python benchmarks/prefix_cache.py [--concurrency 32] [--num-requests 64]
       [--prefix-len 1000] [--suffix-len 24] [--output-len 16] [--input-len 512] [--quick]
"""
from __future__ import annotations

import argparse
import datetime
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import system_entry  # noqa: E402
from llamacpp_peer import free_port  # noqa: E402
from llamacpp_peer import running as running_server  # noqa: E402
from machine_info import device_label  # noqa: E402

from jaxinfer.bench import load, metadata, report, workloads  # noqa: E402
from jaxinfer.bench.serve import run_benchmark  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"caching-on": "--prefix-caching", "caching-off": "--no-prefix-caching"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prefix-len", type=int, default=1000)
    p.add_argument("--suffix-len", type=int, default=24)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--input-len", type=int, default=512, help="unshared scenario prompt length")
    p.add_argument("--unshared-output-len", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--warmup-requests", type=int, default=2)
    p.add_argument("--startup-timeout-s", type=float, default=900.0)
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="smoke run: 4 clients, 8 requests, short prompts")
    a = p.parse_args(argv)
    if a.quick:
        a.concurrency, a.num_requests, a.prefix_len, a.input_len, a.unshared_output_len = 4, 8, 96, 64, 8
    a.max_model_len = 2 ** math.ceil(math.log2(max(a.prefix_len + a.suffix_len + a.output_len,
                                                   a.input_len + a.unshared_output_len) + 1))
    per_request = math.ceil(max(a.prefix_len + a.suffix_len + a.output_len, a.input_len + a.unshared_output_len) / 16)
    a.num_blocks = a.concurrency * per_request + 1
    return a


def scenario(name: str, a) -> workloads.WorkloadConfig:
    if name == "shared":
        return workloads.WorkloadConfig(name="shared-prefix", num_requests=a.num_requests, input_len=a.suffix_len,
                                        output_len=a.output_len, prefix_len=a.prefix_len, num_prefixes=1)
    return workloads.WorkloadConfig(name="fixed", num_requests=a.num_requests, input_len=a.input_len,
                                    output_len=a.unshared_output_len)


def server_cmd(setting: str, port: int, a) -> list[str]:
    return [sys.executable, str(ROOT / "server.py"), "--port", str(port), "--model", a.model,
            "--max-num-seqs", str(a.concurrency), "--max-num-batched-tokens", str(a.max_num_batched_tokens),
            "--max-model-len", str(a.max_model_len), "--num-blocks", str(a.num_blocks), "--max-queue-wait", "600",
            "--log-level", "warning", SETTINGS[setting]]


def main(argv=None) -> dict:
    a = parse_args(argv)
    t0 = time.monotonic()
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / (
        f"{datetime.date.today()}-{device_label()}-prefix-cache{'-quick' if a.quick else ''}")
    result = {"metadata": {**metadata.collect(a.model, {"device": device_label()}), "settings": vars(a).copy()},
              "scenarios": {}}
    rows = []
    for scen in ("shared", "unshared"):
        wl = scenario(scen, a)
        for setting in SETTINGS:
            label = f"{scen}-{setting}"
            print(f"== {label}", flush=True)
            cmd = server_cmd(setting, free_port(), a)
            with running_server(cmd, out / "logs" / f"{label}.log", a.startup_timeout_s) as url:
                cfg = load.LoadConfig(url, a.model, concurrency=a.concurrency, timeout_s=a.timeout_s)
                run = run_benchmark(cfg, wl, label=label, out_dir=out / "runs", warmup_requests=a.warmup_requests,
                                    server_info={"flags": cmd[2:]})
            m = run["metadata"]["server_after"]["metrics"] or {}
            entry = {**system_entry(run["summary"]),
                     "prefix_cache_queries_tokens": m.get("prefix_cache_queries_total"),
                     "prefix_cache_hits_tokens": m.get("prefix_cache_hits_total")}
            result["scenarios"].setdefault(scen, {})[setting] = entry
            rows.append((label, run["summary"]))
    s, u = result["scenarios"]["shared"], result["scenarios"]["unshared"]
    result["ratios"] = {
        "shared_ttft_p50_off_over_on": s["caching-off"]["ttft_ms"]["p50"] / s["caching-on"]["ttft_ms"]["p50"],
        "shared_throughput_on_over_off": s["caching-on"]["output_throughput_tok_s"]
        / s["caching-off"]["output_throughput_tok_s"],
        "unshared_throughput_on_over_off": u["caching-on"]["output_throughput_tok_s"]
        / u["caching-off"]["output_throughput_tok_s"]}
    result["metadata"]["elapsed_s"] = time.monotonic() - t0
    report.write_json(out / "prefix_cache.json", result)
    md = report.markdown_table(rows) + "\n" + "\n".join(f"- {k}: {v:.2f}" for k, v in result["ratios"].items()) + "\n"
    (out / "prefix_cache.md").write_text(md)
    print(md)
    print(f"wrote {out} in {result['metadata']['elapsed_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
