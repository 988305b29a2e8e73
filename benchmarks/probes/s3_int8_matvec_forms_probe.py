"""Scratch probe (2026-12-01, kept with its results): forms of an int8 x float32 matrix-vector
product with jaxinfer's group scales (64 inputs per scale, bfloat16), SmolLM2's seven projection
shapes, 30 unrolled layers over per-layer arrays, one row; 9 interleaved repetitions.

    python int8_matvec_forms_probe.py

f32_dot: float32 weights; int8_now: `jaxinfer.layers.quantization.int8.qdot` (dequantize, then dot);
int8_mulsum: the dequantized weight times x, summed over the inputs; int8_pergroup: int8 times x
summed within each group, then times the scales, summed over groups; int8_rows_layout: the same
with the weights stored [out, in].
"""
import time, sys
import numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from jaxinfer.layers.quantization import int8 as Q
D, F, KV, L = 576, 1536, 192, 30
shapes = [(D, D), (D, KV), (D, KV), (D, D), (D, F), (D, F), (F, D)]
rng = np.random.default_rng(0)
W = []
for (i, o) in shapes:
    lw = []
    for l in range(L):
        w = jnp.asarray(rng.standard_normal((i, o), dtype=np.float32) * 0.02)
        q, s = Q.quantize_array(w, 0, 64) if hasattr(Q, "quantize_array") else None
        lw.append((q, s))
    W.append(lw)
print("scale shape", W[0][0][1].shape, W[0][0][1].dtype)
WT = [[(q.T, s.T) for q, s in lw] for lw in W]
def chain(mv, ws):
    def f(ws, x):
        h = x
        for l in range(L):
            outs = []
            for wl, (i, o) in zip(ws, shapes):
                q, s = wl[l]
                src = h if i == D else jnp.tile(h, 3)[:i]
                outs.append(mv(src, q, s))
            h = h + sum(o[:D].sum() * 1e-6 for o in outs)
        return h
    return jax.jit(f)
def cur(x, q, s):
    return Q.qdot(x[None], q, s, (0,), jnp.float32)[0]
def mulsum(x, q, s):
    return (Q.dequantize(q, s, 0, jnp.float32) * x[:, None]).sum(0)  # scales inside the product
def pergroup(x, q, s):
    G = s.shape[0]
    part = (q.reshape(G, -1, q.shape[1]).astype(jnp.float32) * x.reshape(G, -1, 1)).sum(1)  # [G, out]
    return (part * s.astype(jnp.float32)).sum(0)
def rows_layout(x, q, s):  # q [out, in], s [out, G]
    G = s.shape[1]
    part = (q.reshape(q.shape[0], G, -1).astype(jnp.float32) * x.reshape(1, G, -1)).sum(-1)  # [out, G]
    return (part * s.astype(jnp.float32)).sum(-1)
def f32dot(x, q, s):
    return x @ q
Wf = [[(Q.dequantize(q, s, 0, jnp.float32), None) for q, s in lw] for lw in W]
x = jnp.asarray(rng.standard_normal(D, dtype=np.float32))
V = {"f32_dot": (chain(f32dot, Wf), Wf), "int8_now": (chain(cur, W), W), "int8_mulsum": (chain(mulsum, W), W),
     "int8_pergroup": (chain(pergroup, W), W), "int8_rows_layout": (chain(rows_layout, WT), WT)}
for k, (f, ws) in V.items():
    t = time.perf_counter(); r = f(ws, x).block_until_ready(); print(k, "compile", round(time.perf_counter()-t, 1), float(r.sum()), flush=True)
res = {k: [] for k in V}
for _ in range(9):
    for k, (f, ws) in V.items():
        t = time.perf_counter(); f(ws, x).block_until_ready(); res[k].append((time.perf_counter()-t)*1e3)
for k, v in res.items():
    print(f"{k:18s} median {np.median(v):7.2f} min {np.min(v):7.2f}")
