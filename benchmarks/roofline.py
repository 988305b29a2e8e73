"""Roofline of the decode step: how close a 32-sequence decode step gets to this machine's
measured matmul peak and memory bandwidth, all measured in the same run.

Measures (JAX, the engine's dtype, default float32):
  * matmul throughput (GFLOP/s): 2048^3, and M=32-row shapes (32x2048x2048 and the
    model's own decode matmuls, 32 x D x F and the 32 x D x V logits);
  * memory bandwidth (GB/s): a read-only reduction, a copy into a fresh buffer, and a
    donated in-place update, of a 256 MiB array (bytes read + written / time);
  * the decode step: ``LLM`` with 32 sequences (prompts of each ``--prompt-lens``, so mean
    contexts of ~300 and ~2,000 by default), every step after their prefill timed on its
    own (``engine.step`` wall time, host work included), with the engine's per-phase split
    (schedule / prepare / execute / update, ``LLMEngine.stats.phase_seconds``) and the
    host share = (schedule + prepare + update) / step;
  * the dense-layer probe (`benchmarks/dense_probe.py`, the model's layout and product: the
    packed-product kernel (AMX or AVX-512 BF16) where the runner packed the weights, ``dense_probe_layout``): the step's
    matmuls alone at the same row count, recorded as ``decode.dense_probe_ms`` (XLA's dot
    alone as ``dense_probe_xla_ms``); each
    decode entry reports ``step_over_probe`` = median step / probe.
Model FLOPs per decode token = 2 x (matmul weights) + attention 4 x N x H x context per
layer; bytes per step = weights read once + every sequence's K/V read + new K/V written.
MFU = achieved FLOP/s / matmul peak; bandwidth utilization = bytes/s / read bandwidth.
Writes JSON to ``benchmarks/results/roofline-<date>-<platform>.json``.

Usage: python benchmarks/roofline.py [--batch 32] [--prompt-lens 256 2000] [--decode-steps 32] [--quick]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.bench.metadata import git_commit
from dense_probe import probe_ms  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]


def best_seconds(fn, *args, reps: int = 5) -> float:
    """Minimum wall time (s) of ``fn(*args)`` over ``reps`` runs after one warm-up call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_gflops(m: int, k: int, n: int, dtype, reps: int) -> dict:
    """Throughput of one jitted [m,k] @ [k,n] (random operands): GFLOP/s = 2mkn / time."""
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(ka, (m, k), dtype)
    b = jax.random.normal(kb, (k, n), dtype)
    sec = best_seconds(jax.jit(jnp.matmul), a, b, reps=reps)
    return {"shape": [m, k, n], "seconds": sec, "gflop_s": 2 * m * k * n / sec / 1e9}


def bandwidth_gb_s(nbytes: int, dtype, reps: int) -> dict:
    """Read-only (sum), copy-to-fresh-buffer (x * 1) and donated in-place (x + 1) GB/s."""
    x = jnp.ones((nbytes // jnp.dtype(dtype).itemsize,), dtype)
    read = best_seconds(jax.jit(jnp.sum), x, reps=reps)
    copy = best_seconds(jax.jit(lambda v: v * 1), x, reps=reps)
    upd = jax.jit(lambda v: v + 1, donate_argnums=0)
    y = upd(x)
    jax.block_until_ready(y)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        y = upd(y)
        jax.block_until_ready(y)
        times.append(time.perf_counter() - t0)
    return {"bytes": nbytes, "read_gb_s": nbytes / read / 1e9, "copy_gb_s": 2 * nbytes / copy / 1e9,
            "inplace_gb_s": 2 * nbytes / min(times) / 1e9}


def cfg_kv_bytes(model: str, dtype) -> int:
    """K+V bytes per token of ``model`` (resolved like `LLM`) in ``dtype``."""
    from jaxinfer.config import ModelConfig
    from jaxinfer.weights.catalog import resolve_model

    return ModelConfig.from_dir(resolve_model(model)).kv_bytes_per_token * jnp.dtype(dtype).itemsize // 4


def decode_model_cost(cfg, contexts: list[int], itemsize: int) -> dict:
    """FLOPs and bytes of one decode step over sequences with the given context lengths.

    Returns:
      ``{"flops", "bytes", "weight_bytes", "kv_bytes"}`` for the whole step.
    """
    D, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    N, K, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    per_layer = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F
    matmul_params = L * per_layer + D * V  # the logits matmul (tied or not) reads a [V, D] matrix
    flops = sum(2 * matmul_params + L * 4 * N * H * c for c in contexts)
    kv_per_token = 2 * L * K * H * itemsize
    kv = sum(c * kv_per_token for c in contexts) + len(contexts) * kv_per_token  # read contexts, write new
    weights = matmul_params * itemsize
    return {"flops": flops, "bytes": weights + kv, "weight_bytes": weights, "kv_bytes": kv}


def decode_steps(llm, batch: int, prompt_len: int, steps: int) -> dict:
    """Prefill ``batch`` random prompts, then time ``steps`` steps in which all of them decode
    (outputs are long enough that nobody finishes first; the rest is aborted)."""
    from jaxinfer import SamplingParams

    e = llm.engine
    rs = np.random.RandomState(0)
    prefill_steps = -(-batch * prompt_len // e.config.scheduler.max_num_batched_tokens)
    sp = SamplingParams(temperature=0.0, max_tokens=steps + prefill_steps + 2, ignore_eos=True)
    for i in range(batch):
        e.add_request(f"roof-{i}", rs.randint(256, 16000, prompt_len).tolist(), sp)
    while any(r.num_output_tokens == 0 for r in e.requests.values()):
        e.step()
    times, contexts = [], []
    phases0 = dict(e.stats.phase_seconds)
    while len(times) < steps and len(e.scheduler.running) == batch:
        ctx = [r.num_tokens for r in e.scheduler.running]
        t0 = time.perf_counter()
        e.step()
        times.append(time.perf_counter() - t0)
        contexts.append(ctx)
    phases = {k: 1e3 * (v - phases0[k]) / max(1, len(times)) for k, v in e.stats.phase_seconds.items()}
    for rid in list(e.requests):
        e.abort_request(rid)
    e.step()
    return {"times": times, "contexts": contexts, "phase_ms": phases}


def decode_entry(llm, cfg, args, prompt_len: int, dtype, probe: float, mm: dict, bw: dict) -> dict:
    """Time decode steps at ``prompt_len`` and set them against the probe and both floors."""
    dec = decode_steps(llm, args.batch, prompt_len, args.decode_steps)
    costs = [decode_model_cost(cfg, c, dtype.itemsize) for c in dec["contexts"]]
    step_s = statistics.median(dec["times"])
    flops = statistics.median(c["flops"] for c in costs)
    nbytes = statistics.median(c["bytes"] for c in costs)
    host = sum(dec["phase_ms"][k] for k in ("schedule", "prepare", "update"))
    return {"prompt_len": prompt_len, "step_ms_median": 1e3 * step_s, "step_ms_min": 1e3 * min(dec["times"]),
            "tokens_per_s": args.batch / step_s, "gflop_per_step": flops / 1e9, "gflop_s": flops / step_s / 1e9,
            "gb_per_step": nbytes / 1e9, "gb_s": nbytes / step_s / 1e9,
            "mean_context": float(np.mean(dec["contexts"])), "num_steps_timed": len(dec["times"]),
            "dense_probe_ms": probe, "step_over_probe": 1e3 * step_s / probe,
            "phase_ms_per_step": dec["phase_ms"], "host_share": host / sum(dec["phase_ms"].values()),
            "utilization": {"mfu_vs_square_peak": flops / step_s / 1e9 / mm["square"]["gflop_s"],
                            "mfu_vs_m32_peak": flops / step_s / 1e9 / mm["m32_2048"]["gflop_s"],
                            "bandwidth_vs_read": nbytes / step_s / 1e9 / bw["read_gb_s"],
                            "bandwidth_vs_copy": nbytes / step_s / 1e9 / bw["copy_gb_s"],
                            "compute_floor_ms": 1e3 * flops / (mm["square"]["gflop_s"] * 1e9),
                            "memory_floor_ms": 1e3 * nbytes / (bw["read_gb_s"] * 1e9)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-lens", type=int, nargs="+", default=[256, 2000])
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smaller shapes, fewer steps (exercise the script)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from jaxinfer import LLM

    dtype = jnp.dtype(args.dtype)
    big = 1024 if args.quick else 2048
    if args.quick:
        args.decode_steps, args.reps = 8, 2
        args.prompt_lens = [min(n, 256) for n in args.prompt_lens][:1]
    longest = max(args.prompt_lens)  # its requests' max_tokens also cover the prefill steps (decode_steps)
    max_len = 16 * -(-(longest + args.decode_steps + -(-args.batch * longest // 512) + 2) // 16)
    kv = (args.batch + 1) * max_len * cfg_kv_bytes(args.model, dtype)
    llm = LLM(args.model, dtype=args.dtype, max_model_len=max(1024, max_len), max_num_seqs=args.batch,
              max_num_batched_tokens=512, kv_cache_memory=int(kv / 0.8))
    cfg = llm.engine.model_config
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    mm = {"square": matmul_gflops(big, big, big, dtype, args.reps),
          "m32_2048": matmul_gflops(args.batch, 2048, 2048, dtype, args.reps),
          "m32_mlp": matmul_gflops(args.batch, D, F, dtype, args.reps),
          "m32_logits": matmul_gflops(args.batch, D, V, dtype, args.reps)}
    bw = bandwidth_gb_s((64 if args.quick else 256) << 20, dtype, args.reps)
    # the probe runs the step's products as the model does: the packed-product kernel where the
    # runner packed them (`jaxinfer.kernels.cpu.amx`), else XLA's dot; XLA's is kept for the record
    layout = "scan_amx" if llm.engine.runner.amx is not None else "scan"
    probe = probe_ms(cfg, layout, args.batch, dtype, args.reps)
    probe_xla = probe if layout == "scan" else probe_ms(cfg, "scan", args.batch, dtype, args.reps)
    decode = {str(n): decode_entry(llm, cfg, args, n, dtype, probe, mm, bw) for n in args.prompt_lens}
    first = decode[str(args.prompt_lens[0])]
    result = {
        "benchmark": "roofline", "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": str(jax.devices()[0]), "jax": jax.__version__, "dtype": args.dtype, "model": args.model,
        "git": git_commit(),
        "backend": llm.engine.runner.backend, "batch": args.batch, "prompt_lens": args.prompt_lens,
        "matmul": mm, "bandwidth": bw, "dense_probe_layout": layout, "dense_probe_xla_ms": probe_xla,
        "decode": first, "decode_by_prompt_len": decode,
        "utilization": first["utilization"],
        "quick": args.quick,
    }
    print(json.dumps(result, indent=2))
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / (
        f"roofline-{datetime.date.today()}-{jax.devices()[0].platform}{'-quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
