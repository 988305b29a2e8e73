"""int8 kernel vs the bf16 packed kernel vs XLA's int8 path (qdot, bf16), 30-layer-style scans over
stacks large enough to come from DRAM, alternated in one process."""
import os, statistics, sys, time; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import numpy as np, jax, jax.numpy as jnp
from jaxinfer.kernels.cpu import int8 as native_int8
from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.layers.quantization import int8 as quant
assert native_int8.available() and native_amx.available()
rng = np.random.default_rng(0)
for K, N in [(576, 576), (576, 960), (1536, 576), (576, 3072)]:
    L = -(-300_000_000 // (K * N * 2))
    w = (rng.standard_normal((L, K, N)) * 0.05).astype(np.float32)
    q, s = quant.quantize_array(jnp.asarray(w), 1)
    pi8 = native_int8.pack(q, s)
    pbf = jnp.asarray(native_amx.pack(w.astype(jnp.bfloat16)))
    del w
    for M in [int(m) for m in os.environ.get("ROWS", "1 32").split()]:
        x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
        def scan(mm, pk):
            def f(x, pk):
                def body(c, l): return c + mm(x, pk, l)[:, :1].sum(), None
                return jax.lax.scan(body, jnp.float32(0), jnp.arange(L, dtype=jnp.int32))[0]
            return jax.jit(f)
        fns = {"int8": (scan(native_int8.matmul, pi8), pi8), "bf16": (scan(native_amx.matmul, pbf), pbf)}
        for f, a in fns.values(): jax.block_until_ready(f(x, a))
        ts = {n: [] for n in fns}
        for _ in range(15):
            for n, (f, a) in fns.items():
                t0 = time.perf_counter(); jax.block_until_ready(f(x, a)); ts[n].append(time.perf_counter() - t0)
        print(f"K={K} N={N} M={M} L={L}: " + " | ".join(f"{n} {1e3*statistics.median(v)/L*30:.3f} ms/30 layers" for n, v in ts.items()), flush=True)
