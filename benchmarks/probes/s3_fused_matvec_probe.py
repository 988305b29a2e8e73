"""Scratch probe (2026-12-01, kept with its results): can a lone stream's matrix-vector products
read 8/16-bit weights with the convert fused? SmolLM2's seven projection shapes, 30 unrolled
layers over per-layer arrays (weights far larger than the caches), one row.

    python fused_matvec_probe.py 9      # repetitions, interleaved; medians and minimums

dot_*: ``x @ w`` ([in, out] weights, a narrow weight converted first); reduce_cols_*: the same
as multiply + sum over the input axis; reduce_rows_*: weights stored [out, in], sum over the
contiguous input axis.
"""
import time, sys, json
import numpy as np, jax, jax.numpy as jnp

D, F, KV, L = 576, 1536, 192, 30
shapes = [(D, D), (D, KV), (D, KV), (D, D), (D, F), (D, F), (F, D)]  # [in, out]
rng = np.random.default_rng(0)

def make(dtype):
    ws = []
    for (i, o) in shapes:
        w = rng.standard_normal((L, i, o), dtype=np.float32) * 0.02
        if dtype == "int8":
            ws.append([(jnp.asarray(np.clip(np.round(w[l] / 0.02 * 40), -127, 127).astype(np.int8)),
                       jnp.asarray(np.full((1, o), 0.02 / 40, np.float32))) for l in range(L)])
        else:
            ws.append([(jnp.asarray(w[l].astype(dtype)), None) for l in range(L)])
    return ws

def chain(mv):
    def f(ws, x):
        def layer(h, l):
            outs = []
            for wlist, (i, o) in zip(ws, shapes):
                wl, sl = wlist[l]
                src = h if i == D else jnp.tile(h, 3)[: i]
                outs.append(mv(src, wl, sl))
            return h + sum(o[:D].sum() * 1e-6 for o in outs), None
        h = x
        for l in range(L):  # unrolled like the one-token bucket
            h, _ = layer(h, l)
        return h
    return jax.jit(f)

def dot_f32(x, w, s):
    y = x @ w if w.dtype == jnp.float32 else x @ w.astype(jnp.float32)
    return y if s is None else y * s.reshape(-1)

def reduce_cols(x, w, s):  # y[o] = sum_i x[i] w[i,o]
    y = (x[:, None] * w.astype(jnp.float32)).sum(0)
    return y if s is None else y * s.reshape(-1)

def reduce_rows(x, w, s):  # weights stored [out, in]
    y = (w.astype(jnp.float32) * x[None, :]).sum(1)
    return y if s is None else y * s.reshape(-1)

def dot_mixed(x, w, s):  # dot with preferred f32 on narrow operand
    y = jax.lax.dot_general(x.astype(w.dtype) if w.dtype != jnp.int8 else x, w if w.dtype != jnp.int8 else w.astype(jnp.float32), (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return y if s is None else y * s.reshape(-1)

variants = {}
x = jnp.asarray(rng.standard_normal(D, dtype=np.float32))
for dt in ["float32", "bfloat16", "int8"]:
    ws = make(dt if dt != "bfloat16" else jnp.bfloat16)
    variants[f"dot_{dt}"] = (chain(dot_f32), ws)
    variants[f"reduce_cols_{dt}"] = (chain(reduce_cols), ws)
    wsT = [[(w.T, None if s is None else s.T) for w, s in wl] for wl in ws]
    variants[f"reduce_rows_{dt}"] = (chain(lambda x, w, s: reduce_rows(x, w, None if s is None else s)), wsT)
    if dt == "bfloat16":
        variants["dot_bf16_native"] = (chain(dot_mixed), ws)
for k, (f, ws) in variants.items():
    t = time.perf_counter(); f(ws, x).block_until_ready(); print(k, "compile", round(time.perf_counter() - t, 1), flush=True)
res = {k: [] for k in variants}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 15):
    for k, (f, ws) in variants.items():
        t = time.perf_counter(); f(ws, x).block_until_ready(); res[k].append((time.perf_counter() - t) * 1e3)
for k, v in res.items():
    print(f"{k:28s} median {np.median(v):7.2f} ms  min {np.min(v):7.2f}")
