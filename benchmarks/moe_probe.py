"""MoE probe: one decode step's MoE layer against a dense MLP with the same active parameters.

For each shape (a Mixtral-like one: 8 experts, top 2; a Qwen3-MoE-like one: 64 experts, top
8, scaled down to fit a shared CPU) and each of `jaxinfer.layers.moe.EXPERT_IMPLS` (ragged
``ragged_dot`` over assignments sorted by expert; ``dense``: every expert on every token,
masked; ``gather``: expert weights gathered per assignment), it times the jitted layer
(router + top-k + experts + combine) at ``--rows`` tokens, under two routings: ``spread``
(router logits random) and ``skewed`` (every token's top k are experts 0..k-1). The baseline
is a SwiGLU MLP of width ``k * F`` (the experts' active parameters) on the same rows. The
acceptance bound is MoE / dense <= 1.5 at 32 rows. Also timed: a SwiGLU MLP of width
``touched * F``, where ``touched`` is the number of distinct experts the spread routing picks:
the weight bytes any method must read, so the floor of a step that is bound by reading weights.
``model_impl`` is the one the model runs (`jaxinfer.layers.moe.DEFAULT_IMPL`).

Weights are jit arguments (never constants). Each timing is the median of ``--reps`` calls
after one warm-up call. The compile count after warm-up is also recorded for the two routings
(fixed shapes: the skewed routing must reuse the spread routing's executable).

Usage: python benchmarks/moe_probe.py [--rows 32 256] [--reps 20] [--dtype float32] [--shapes ...]
[--impls ragged segment dense gather] [--out FILE]
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
from jaxinfer.layers.moe import DEFAULT_IMPL, EXPERT_IMPLS, route

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # name: (D, F per expert, E, k)
    "mixtral_like": (1024, 1792, 8, 2),
    "qwen3_moe_like": (1024, 384, 64, 8),
    "cache_resident": (256, 128, 8, 2),  # all experts' weights (3 MB) stay in cache: compute, not reads
}


def _timeit(fn, args, reps: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def dense_mlp(x, wg, wu, wd):
    f32 = jnp.float32
    g = jnp.dot(x, wg, preferred_element_type=f32)
    u = jnp.dot(x, wu, preferred_element_type=f32)
    return jnp.dot((jax.nn.silu(g) * u).astype(x.dtype), wd, preferred_element_type=f32)


def moe_layer(impl):
    def f(x, router, wg, wu, wd):
        logits = jnp.dot(x, router, preferred_element_type=jnp.float32)
        w, e = route(logits, K, True)
        return EXPERT_IMPLS[impl](x, w, e, wg, wu, wd, dtype=x.dtype)
    return f


K = 2  # set per shape (route's top_k must be static)


def probe(name, shape, rows, reps, dtype, rs, impls=tuple(EXPERT_IMPLS)):
    global K
    D, F, E, k = shape
    K = k
    arr = lambda *s: jnp.asarray(rs.standard_normal(s).astype(np.float32) * 0.02, dtype)  # noqa: E731
    x = arr(rows, D)
    wg, wu, wd = arr(E, D, F), arr(E, D, F), arr(E, F, D)
    router_spread = arr(D, E) * 50
    # skewed: the router is zero but for experts 0..k-1, which every token then picks
    router_skew = jnp.zeros((D, E), dtype).at[:, :k].set(1.0)
    x_skew = jnp.abs(x)
    dg, du, dd = arr(D, k * F), arr(D, k * F), arr(k * F, D)
    touched = int(np.unique(np.asarray(route(jnp.dot(x, router_spread, preferred_element_type=jnp.float32), k,
                                             True)[1])).size)
    tg, tu, td = arr(D, touched * F), arr(D, touched * F), arr(touched * F, D)
    out = {"D": D, "F": F, "E": E, "k": k, "rows": rows, "model_impl": DEFAULT_IMPL,
           "dense_mlp_ms": _timeit(jax.jit(dense_mlp), (x, dg, du, dd), reps),
           "experts_touched_spread": touched,
           # the floor of any method: a dense MLP reading the touched experts' weights once
           "dense_mlp_touched_width_ms": _timeit(jax.jit(dense_mlp), (x, tg, tu, td), reps)}
    ref = None
    for impl in impls:
        if impl == "gather" and rows > 32:
            continue  # copies rows * k expert matrices: minutes at prefill sizes
        fn = jax.jit(moe_layer(impl))
        spread = _timeit(fn, (x, router_spread, wg, wu, wd), reps)
        before = fn._cache_size()
        skew = _timeit(fn, (x_skew, router_skew, wg, wu, wd), reps)
        y = np.asarray(fn(x, router_spread, wg, wu, wd), np.float32)
        ref = y if ref is None else ref
        out[impl] = {"spread_ms": spread, "skewed_ms": skew, "ratio_to_dense_spread": spread / out["dense_mlp_ms"],
                     "ratio_to_dense_skewed": skew / out["dense_mlp_ms"],
                     "ratio_to_touched_floor_spread": spread / out["dense_mlp_touched_width_ms"],
                     "compiles_after_warmup": fn._cache_size() - before,
                     "max_abs_diff_vs_ragged": float(np.max(np.abs(y - ref)))}
        print(name, rows, impl, {k2: round(v, 3) if isinstance(v, float) else v for k2, v in out[impl].items()},
              "dense", round(out["dense_mlp_ms"], 3), "floor", round(out["dense_mlp_touched_width_ms"], 3), flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[32, 256])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--impls", nargs="+", default=list(EXPERT_IMPLS), choices=list(EXPERT_IMPLS))
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    rs = np.random.RandomState(0)
    results = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": git_commit(ROOT), "jax": jax.__version__, "backend": jax.default_backend(),
               "dtype": a.dtype, "reps": a.reps, "runs": []}
    for rows in a.rows:
        for name in a.shapes:
            results["runs"].append({"shape": name, **probe(name, SHAPES[name], rows, a.reps, jnp.dtype(a.dtype), rs,
                                                                 tuple(a.impls))})
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
