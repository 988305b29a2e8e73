"""Offline throughput of `LLM.generate` on the default model.

Two measurements in one run, same engine:
  * mixed: N prompts of varied lengths (uniform 32..512 tokens), max_tokens 128,
    output tokens/s over the whole call (prefill included), mean step time;
  * decode: B sequences decoding together after their prefill (decode-only tok/s),
    the figure comparable to transformers' batched decode throughput.
Writes JSON to benchmarks/results/offline-<date>-<device>.json with the commit, dtype,
device, JAX version and settings.

Usage: python benchmarks/offline_throughput.py [--model NAME] [--dtype float32]
       [--num-prompts 64] [--decode-batch 32] [--decode-tokens 64] [--quick]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import numpy as np

from jaxinfer import LLM, SamplingParams
from jaxinfer.bench.metadata import git_commit

ROOT = Path(__file__).resolve().parents[1]



def timed_generate(llm: LLM, prompts, sp) -> dict:
    e = llm.engine
    steps0, secs0 = e.stats.num_steps, e.stats.step_seconds
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    steps = e.stats.num_steps - steps0
    return {"wall_s": wall, "output_tokens": n_out, "output_tok_s": n_out / wall, "steps": steps,
            "mean_step_ms": 1e3 * (e.stats.step_seconds - secs0) / max(steps, 1)}


def decode_only(llm: LLM, batch: int, prompt_len: int, new_tokens: int) -> dict:
    """Prefill `batch` prompts (1 token generated), then time steps where all decode."""
    rs = np.random.RandomState(1)
    e = llm.engine
    sp = SamplingParams(temperature=0.0, max_tokens=new_tokens + 1, ignore_eos=True)
    for i in range(batch):
        e.add_request(f"dec-{i}", rs.randint(100, 20000, prompt_len).tolist(), sp)
    while any(r.num_output_tokens == 0 for r in e.requests.values()):
        e.step()
    t0, n = time.perf_counter(), 0
    steps = 0
    while e.has_unfinished_requests():
        outs = e.step()
        n += sum(1 for o in outs if o.outputs[0].token_ids)
        steps += 1
    wall = time.perf_counter() - t0
    return {"batch": batch, "prompt_len": prompt_len, "decode_steps": steps, "decode_tokens": n,
            "decode_tok_s": n / wall, "mean_decode_step_ms": 1e3 * wall / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--decode-batch", type=int, default=32)
    ap.add_argument("--decode-prompt-len", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--attention-backend", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny run to exercise the script")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.num_prompts, args.max_tokens, args.decode_batch, args.decode_tokens = 8, 16, 8, 8
    t0 = time.perf_counter()
    llm = LLM(args.model, dtype=args.dtype, max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=512,
              attention_backend=args.attention_backend)
    startup = time.perf_counter() - t0
    rs = np.random.RandomState(0)
    prompts = [rs.randint(100, 20000, int(n)).tolist() for n in rs.randint(32, 512, args.num_prompts)]
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    mixed = timed_generate(llm, prompts, sp)
    dec = decode_only(llm, args.decode_batch, args.decode_prompt_len, args.decode_tokens)
    import jax

    result = {
        "benchmark": "offline_throughput", "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit()["commit"], "model": args.model, "dtype": args.dtype, "device": str(jax.devices()[0]),
        "backend": llm.engine.runner.backend, "jax": jax.__version__, "machine": platform.processor() or platform.machine(),
        "cpu_count": __import__("os").cpu_count(), "startup_s": startup,
        "warmup_compilations": llm.engine.runner.num_compilations,
        "settings": {"num_prompts": args.num_prompts, "prompt_len": "uniform[32,512)", "max_tokens": args.max_tokens,
                     "max_num_seqs": 32, "max_num_batched_tokens": 512},
        "mixed": mixed, "decode": dec,
    }
    print(json.dumps(result, indent=2))
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / (
        f"offline-{datetime.date.today()}-{jax.devices()[0].platform}{'-quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
