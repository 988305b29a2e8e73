"""Offline engine throughput, continuous against static batching, on random weights.

Issue 21's engine line: Llama-3-8B-shaped dummy weights in bfloat16, ``--batch`` prompts of
``--input`` random tokens, ``--output`` greedy tokens each (``ignore_eos``), submitted at
once through `jaxinfer.LLM.generate`. For each scheduler (and attention backend) the
engine is built on the same weights, the workload runs once to compile its buckets, then
once timed. Reported: output tokens per second, wall seconds, the static/continuous
ratio, and per compiled step its temporary bytes and any copies of the KV cache
(`executable_memory`). Meant for a GPU (an 8B model in bfloat16 is 16 GB); on CPU use a small config or
``--layers``.

Usage:
  python benchmarks/engine_throughput.py --config configs/llama-3-8b.json --out DIR
  python benchmarks/engine_throughput.py --config tiny.json --batch 8 --input 16 --output 8
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def executable_memory(runner) -> list[dict]:
    """Per compiled model step: XLA's temporary bytes and the copies of a KV-cache-shaped array
    in its optimised HLO, against one cache's bytes. A step that copies the stacked cache (a
    donation or an in-place update XLA could not keep) moves it all per step, or per layer
    inside the layer loop; this shows it without a profiler."""
    cache = runner.k_cache
    shape = f"[{','.join(map(str, cache.shape))}]"
    rows = []
    for bucket, executable in runner._executables.items():
        analysis = executable.memory_analysis()
        copies = sum(1 for line in executable.as_text().splitlines()
                     if " copy(" in line and shape in line.split(" copy(")[0])
        rows.append({"bucket": str(bucket), "temp_bytes": int(analysis.temp_size_in_bytes),
                     "cache_bytes": int(cache.nbytes), "cache_shaped_copies": copies})
    return rows


def run_one(model_config, params, scheduler: str, backend: str, args) -> dict:
    """Build one engine, run the workload twice (compile, then timed); returns the figures."""
    import jax

    from jaxinfer import LLM, SamplingParams

    max_len = args.input + args.output + 16
    build_start = time.perf_counter()
    llm = LLM("dummy", dtype=args.dtype, max_model_len=max_len, max_num_seqs=args.batch,
              max_num_batched_tokens=max(args.batch * args.input, args.batch),
              num_blocks=args.batch * (max_len // 16 + 2) + 1, attention_backend=backend,
              warmup=False, enable_prefix_caching=False, scheduler=scheduler,
              model_config=model_config, params=params, tokenizer=None)
    built_s = time.perf_counter() - build_start
    rng = np.random.default_rng(0)
    prompts = [rng.integers(17, model_config.vocab_size, size=args.input).tolist()
               for _ in range(args.batch)]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.output, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, greedy, use_tqdm=False)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    outs = llm.generate(prompts, greedy, use_tqdm=False)
    seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    memory = executable_memory(llm.engine.runner)
    del llm
    jax.clear_caches()
    return {"scheduler": scheduler, "backend": backend, "build_s": built_s,
            "first_run_s": first_s, "seconds": seconds, "output_tokens": generated,
            "output_tok_per_s": generated / seconds, "executables": memory}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "llama-3-8b.json"))
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--input", type=int, default=128, help="prompt tokens each")
    ap.add_argument("--output", type=int, default=128, help="output tokens each")
    ap.add_argument("--schedulers", default="continuous,static")
    ap.add_argument("--backends", default="pallas")
    ap.add_argument("--out", default=None, help="folder for engine_throughput.json")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    from jaxinfer.entrypoints.plan import load_config
    from jaxinfer.models.params import init_params

    model_config = load_config(args.config, args.layers or None)
    start = time.perf_counter()
    params = init_params(model_config, args.dtype, seed=0)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": str(jax.devices()[0]), "jax": jax.__version__,
              "python": platform.python_version(), "config": args.config, "args": vars(args),
              "init_params_s": time.perf_counter() - start, "runs": []}
    for backend in args.backends.split(","):
        for scheduler in args.schedulers.split(","):
            run = run_one(model_config, params, scheduler, backend, args)
            report["runs"].append(run)
            print(f"{backend:7s} {scheduler:10s} {run['output_tok_per_s']:9.1f} tok/s "
                  f"({run['seconds']:.2f} s timed, {run['first_run_s']:.1f} s first)", flush=True)
            if args.out:  # after each run: a run cut short by a time limit keeps what it did
                out = pathlib.Path(args.out)
                out.mkdir(parents=True, exist_ok=True)
                (out / "engine_throughput.json").write_text(json.dumps(report, indent=1))
    by = {(r["backend"], r["scheduler"]): r["output_tok_per_s"] for r in report["runs"]}
    for backend in args.backends.split(","):
        if (backend, "static") in by and (backend, "continuous") in by:
            print(f"{backend}: continuous / static = {by[backend, 'continuous'] / by[backend, 'static']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
