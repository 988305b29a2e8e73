"""Scratch probe (2026-12-02): one layer of the C++ decode kernel alone (32 rows, context 640, SmolLM2's
heads), jitted, median of 20 calls over different layers; also a context of 0 (call overhead).

    python kernel_layer_probe.py
"""
import sys, time, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from jaxinfer.kernels.cpu import attention as native_attention
L, NB, bs, K, G, H = 30, 1600, 16, 3, 3, 64
R, CTX = 32, 640; W = CTX // bs + 1
rng = np.random.default_rng(0)
kc = jnp.asarray(rng.standard_normal((L, NB, bs, K, H), np.float32)); vc = kc
q = jnp.asarray(rng.standard_normal((R, K, G, H), np.float32) * 0.1)
tables = jnp.asarray(rng.permutation(NB - 1)[: R * W].reshape(R, W) + 1, jnp.int32)
ctx = jnp.full((R,), CTX, jnp.int32)
f = jax.jit(native_attention.decode_context)
for ctxv in (CTX, 0):
    c = jnp.full((R,), ctxv, jnp.int32)
    jax.block_until_ready(f(q, kc, vc, jnp.int32(3), tables, c, c, None))
    ts = []
    for i in range(20):
        t0 = time.perf_counter(); jax.block_until_ready(f(q, kc, vc, jnp.int32(i % 30), tables, c, c, None)); ts.append(time.perf_counter() - t0)
    print("ctx", ctxv, "median per layer ms", round(sorted(ts)[10] * 1e3, 2), "GB/s", round(R * ctxv * K * H * 8 / sorted(ts)[10] / 1e9, 2))
