"""Sampler step time at 32 rows over Gemma 3's 262,144-token vocabulary (CPU or GPU).

Times the jitted `jaxinfer.layers.sampler.sample` (no model) for: greedy rows; top-k 50 + top-p 0.9
(filtered on `sampler.CANDIDATES` candidates from ``lax.top_k``); top-p 0.9 alone on peaked
logits (the candidates hold the nucleus); top-p 0.9 alone on flat logits (the nucleus is
wider than the candidates: the fallback, a full sort per row before 2026-12-04, bisection
since); the bisection filter alone; and a full sort of the rows alone.
Writes a JSON of median milliseconds per call.

    python benchmarks/sampler_step.py [--rows 32] [--vocab 262144] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.runner import batch as B
from jaxinfer.layers import sampler
from jaxinfer.runner.buckets import Bucket, BucketLadders
from jaxinfer.layers.step_metadata import SamplingMetadata, from_arrays


def inputs(rows: int, vocab: int, **fields) -> SamplingMetadata:
    layout = B.BatchLayout(BucketLadders(rows, rows, 16), 16, vocab, 256, 8)
    a = B.empty_inputs(Bucket(rows, rows, 0), layout, penalties=False).to_arrays()
    for k, v in fields.items():
        a[k][...] = v
    a["any_sampled"][...] = not np.all(a["greedy"])
    a["any_sort"][...] = np.any((a["top_k"] < vocab) | (a["top_p"] < 1))
    return from_arrays(SamplingMetadata, a)


def timed(fn, *args, reps: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--vocab", type=int, default=262_144)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    R, V = a.rows, a.vocab
    rng = np.random.default_rng(0)
    peaked = jnp.asarray(rng.normal(0, 1, (R, V)) * 3 + (np.arange(V) < 10) * 25, jnp.float32)
    flat = jnp.asarray(rng.normal(0, 1, (R, V)), jnp.float32)
    sample = jax.jit(lambda l, s: sampler.sample(l, s, 0)["token_ids"])
    sampled = dict(greedy=False, temperature=1.0)
    cases = {
        "greedy": (peaked, inputs(R, V)),
        "top_k50_top_p0.9": (peaked, inputs(R, V, top_k=50, top_p=0.9, **sampled)),
        "top_p0.9_peaked_candidates": (peaked, inputs(R, V, top_p=0.9, **sampled)),
        "top_p0.9_flat_fallback": (flat, inputs(R, V, top_p=0.9, **sampled)),
    }
    result = {name: timed(sample, lg, s, reps=a.reps) for name, (lg, s) in cases.items()}
    s = inputs(R, V, top_p=0.9, **sampled)
    result["bisect_filter_only"] = timed(jax.jit(sampler._filter_bisect), flat, s, reps=a.reps)
    result["full_sort_only"] = timed(jax.jit(lambda l: jnp.sort(l, axis=-1)), flat, reps=max(1, a.reps // 2))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"rows": R, "vocab": V, "candidates": sampler.CANDIDATES, "median_ms": result,
           "device": str(jax.devices()[0]), "machine": platform.processor() or platform.machine(), "commit": commit}
    text = json.dumps(out, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
