"""The attention kernel alone on a 512-token prompt's chunk (SmolLM2-135M's shapes: 3 KV heads,
9 query heads, head dim 64, bfloat16 pages of 16 tokens, 30 layers), AMX loop on and off,
alternated in one process; median of 7 runs of all 30 layers each."""
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from jaxinfer.kernels.cpu import attention as native_attention  # noqa: E402

T, K, G, H, L, NB = 512, 3, 3, 64, 30, 64
rng = np.random.default_rng(0)
bits = lambda x: jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.bfloat16), jnp.uint16)  # noqa: E731
q = jnp.asarray(rng.standard_normal((T, K, G, H)) * 0.125, jnp.float32)
kc, vc = bits(rng.standard_normal((L, NB, 16, K, H))), bits(rng.standard_normal((L, NB, 16, K, H)))
tables = jnp.tile(jnp.asarray(rng.permutation(NB)[:32], jnp.int32), (T, 1))
pos = jnp.arange(T, dtype=jnp.int32)
run = jax.jit(lambda q, kc, vc: [native_attention.paged_context(q, kc, vc, layer, tables, pos + 1, pos, None)[2]
                                 for layer in range(L)])
times = {"1": [], "0": []}
for _ in range(8):
    for amx in ("1", "0"):
        os.environ["JAXINFER_NATIVE_AMX"] = amx
        t = time.perf_counter()
        jax.block_until_ready(run(q, kc, vc))
        times[amx].append((time.perf_counter() - t) * 1e3)
for amx, ts in times.items():
    print(f"AMX {'on ' if amx == '1' else 'off'}: {statistics.median(ts[1:]):.1f} ms per 30 layers "
          f"(512 queries, context 1-512)")
