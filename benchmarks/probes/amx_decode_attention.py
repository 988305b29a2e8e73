"""Probe: the C++ paged-attention kernel alone for 32 decode rows over all 30 layers of
SmolLM2's shapes (3 KV heads x 3 query heads, head dim 64, bfloat16 pages of 16 tokens).

Usage: python decode_attention.py [CONTEXT=281]   (run from anywhere; uses this checkout)
  HOT=1   every row reads the same pages (they stay in cache): the kernel's compute alone
  NC=4    rotate over NC separate caches of 1,537 blocks (pages cold, as in a served step)
"""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxinfer.kernels.cpu import attention as native_attention  # noqa: E402

R, K, G, H, bs, NB, L = 32, 3, 3, 64, 16, 1537, 30
CTX = int(sys.argv[1]) if len(sys.argv) > 1 else 281
NC = int(os.environ.get("NC", 1))
rng = np.random.default_rng(0)
make = jax.jit(lambda key: jax.random.randint(key, (L, NB, bs, K, H), 0x3C00, 0x3F80).astype(jnp.uint16))
caches = [(make(jax.random.PRNGKey(2 * i)), make(jax.random.PRNGKey(2 * i + 1))) for i in range(NC)]
q = jnp.asarray(rng.standard_normal((R, K, G, H)), jnp.float32) * 0.125
W = (CTX + 64) // bs + 1
pages = np.tile(np.arange(1, W + 1), (R, 1)) if os.environ.get("HOT") else rng.permutation(NB - 1)[: R * W].reshape(R, W) + 1
tables = jnp.asarray(pages, jnp.int32)
ctx = jnp.asarray(rng.integers(CTX - 80, CTX + 80, R), jnp.int32)
pos = ctx - 1


def all_layers(q, kc, vc, t, c, p):
    for layer in range(L):
        _, _, acc = native_attention.paged_context(q, kc, vc, jnp.int32(layer), t, c, p, None)
        q = q + 1e-3 * acc
    return q


f = jax.jit(all_layers)
assert native_attention.available()
jax.block_until_ready(f(q, *caches[0], tables, ctx, pos))
best = []
for _ in range(3):
    t0 = time.perf_counter()
    for i in range(40):
        out = f(q, *caches[i % NC], tables, ctx, pos)
    jax.block_until_ready(out)
    best.append((time.perf_counter() - t0) / 40)
dt = min(best)
kv_bytes = int(np.sum(np.asarray(ctx))) * L * 2 * K * H * 2
print(f"context ~{CTX}: {dt * 1e3:.2f} ms per 30 layers; {kv_bytes / dt / 1e9:.1f} GB/s of K/V")
