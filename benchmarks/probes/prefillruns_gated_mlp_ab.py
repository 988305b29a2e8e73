"""The MLP's first half, act(x wg) * (x wu) in bfloat16, two ways alternated in one process:
"separate" (two `native_amx.matmul` calls writing float32 g and u, then XLA's jax.nn.silu(g) * u
cast to bfloat16: the model's path before `native_amx.gated_matmul`) and "fused" (one
`native_amx.gated_matmul` call). SmolLM2-135M's shapes (K 576, F 1536), 30 scanned layers per
call, 8 weight stacks in rotation (each variant's 8 stacks: 850 MB, more than this CPU's L3, so
weights come from DRAM as in the model's step), M = 32 and 512 rows. Median of 6 alternated
rounds of 8 calls. Usage: gated_mlp_ab.py (ROWS=8,32,512 replaces the row counts)."""
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from jaxinfer.kernels.cpu import amx as native_amx  # noqa: E402

assert native_amx.available(), "needs AMX"
L, NC, K, F = 30, 8, 576, 1536
ROWS = [int(m) for m in os.environ.get("ROWS", "32,512").split(",")]


def scanned(first_half):
    def run(x, weights):
        def body(c, layer):
            # bfloat16 [M, F], written whole as for the down projection (no fusion into the sum)
            h = lax.optimization_barrier(first_half(c, weights, layer))
            return c + 1e-3 * h.astype(jnp.float32).sum(1, keepdims=True), None
        return lax.scan(body, x, jnp.arange(L, dtype=jnp.int32))[0]
    return jax.jit(run)


def separate(x, weights, layer):
    g = native_amx.matmul(x, weights[0], layer)
    u = native_amx.matmul(x, weights[1], layer)
    return (jax.nn.silu(g) * u).astype(jnp.bfloat16)


def fused(x, weights, layer):
    return native_amx.gated_matmul(x, weights, layer, "silu")


runs = {"separate": scanned(separate), "fused": scanned(fused)}
rng = np.random.default_rng(0)
stacks = {"separate": [], "fused": []}
for _ in range(NC):
    wg, wu = (np.asarray(jnp.asarray(rng.standard_normal((L, K, F)) * 0.02, jnp.bfloat16)) for _ in range(2))
    stacks["separate"].append((jnp.asarray(native_amx.pack(wg)), jnp.asarray(native_amx.pack(wu))))
    stacks["fused"].append(jnp.asarray(native_amx.pack_gated(wg, wu)))
for M in ROWS:
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    outs = {name: [np.asarray(f(x, s)) for s in stacks[name]] for name, f in runs.items()}
    for a, b in zip(outs["separate"], outs["fused"]):  # the same products: within bfloat16 rounding
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
    times = {name: [] for name in runs}
    for _ in range(6):
        for name, f in runs.items():
            for s in stacks[name]:
                t0 = time.perf_counter()
                f(x, s).block_until_ready()
                times[name].append(time.perf_counter() - t0)
    print(f"{L} x ({M} x {K} x 2 x {F}, act(g) * u): "
          + " | ".join(f"{n} {1e3 * np.median(t):.2f} ms" for n, t in times.items()), flush=True)
