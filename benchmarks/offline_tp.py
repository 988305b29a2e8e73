"""Offline throughput of `LLM.generate` at tensor-parallel degrees 1, 2, 4 (and DP).

A functional check on fake CPU devices (``--xla_force_host_platform_device_count``): the
same greedy workload runs once to compile its buckets, then again timed; every TP/DP
setting must return the same tokens as TP 1. On a CPU host the "devices" share the same
cores, so TP > 1 is slower here (collectives with no extra compute); on real
accelerators run it with ``--no-fake-devices`` for real numbers.
Writes JSON to benchmarks/results/offline_tp-<date>-<platform>.json.

Usage: python benchmarks/offline_tp.py [--model NAME] [--settings 1x1,2x1,4x1,2x2]
       [--num-prompts 16] [--max-tokens 32] [--quick]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

from jaxinfer.bench.metadata import git_commit

ROOT = Path(__file__).resolve().parents[1]


def run_setting(args, tp: int, dp: int, prompts) -> dict:
    from jaxinfer import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(args.model, dtype=args.dtype, tensor_parallel_size=tp, data_parallel_size=dp, max_model_len=256,
              max_num_seqs=16, max_num_batched_tokens=128, warmup=False, enable_prefix_caching=False,
              load_format=args.load_format)
    build_s = time.perf_counter() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)  # compiles the buckets this workload needs
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"tensor_parallel_size": tp, "data_parallel_size": dp, "build_s": build_s, "first_pass_s": first_s,
            "wall_s": wall, "output_tokens": n_out, "output_tok_s": n_out / wall,
            "tokens": [o.outputs[0].token_ids for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--settings", default="1x1,2x1,4x1,2x2", help="comma list of TPxDP")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--fake-devices", type=int, default=8, help="CPU devices to fake (0: use real devices)")
    ap.add_argument("--quick", action="store_true", help="4 prompts, 8 tokens, TP 1 and 2")
    args = ap.parse_args()
    if args.quick:
        args.num_prompts, args.max_tokens, args.settings = 4, 8, "1x1,2x1"
    if args.fake_devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.fake_devices}").strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np

    rs = np.random.RandomState(0)
    prompts = [rs.randint(100, 20000, int(n)).tolist() for n in rs.randint(16, 96, args.num_prompts)]
    settings = [tuple(int(v) for v in s.split("x")) for s in args.settings.split(",")]
    results = []
    for tp, dp in settings:
        r = run_setting(args, tp, dp, prompts)
        r["same_tokens_as_first"] = r["tokens"] == (results[0]["tokens"] if results else r["tokens"])
        print(f"TP {tp} x DP {dp}: {r['output_tok_s']:.1f} output tok/s (warm pass {r['wall_s']:.2f} s, "
              f"first pass {r['first_pass_s']:.2f} s), same tokens: {r['same_tokens_as_first']}", flush=True)
        results.append(r)
    for r in results:
        r.pop("tokens")
    out = {"benchmark": "offline_tp", "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "commit": git_commit()["commit"], "jax": jax.__version__, "platform": jax.default_backend(),
           "devices": [str(d) for d in jax.devices()], "host": platform.processor() or platform.machine(),
           "fake_devices": args.fake_devices, "model": args.model, "dtype": args.dtype,
           "num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "results": results}
    path = ROOT / "benchmarks" / "results" / (
        f"offline_tp-{datetime.date.today().isoformat()}-{jax.default_backend()}{'-quick' if args.quick else ''}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path.relative_to(ROOT)}")
    if not all(r["same_tokens_as_first"] for r in results):
        sys.exit("tokens differ between settings")


if __name__ == "__main__":
    main()
