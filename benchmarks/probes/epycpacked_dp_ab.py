"""Packed products on this CPU (amx_gemm.cc built here: AVX-512 BF16 path without AMX) against
XLA's dot over bit-stored stacked weights under a scan (the model's non-AMX path), 30 layers,
alternated in one process. Shapes: gated MLP 576 -> 2x1536 (gate_up) and down 1536 -> 576."""
import logging, os, statistics, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import jax, jax.numpy as jnp, numpy as np
from jaxinfer.kernels.cpu import build as native_build
from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.layers import cpu_bf16
why = native_build.register(native_amx.SOURCE, "probe", "JAXINFER_NATIVE_AMX",
                            {"probe_gemm": "JaxinferAmxGemm", "probe_gated": "JaxinferAmxGated"}, logging.getLogger("p"))
assert why is None, why
L = 30
rng = np.random.default_rng(0)
K, F = 576, 1536
wg = jnp.asarray(rng.standard_normal((L, K, F)) * 0.05, jnp.bfloat16)
wu = jnp.asarray(rng.standard_normal((L, K, F)) * 0.05, jnp.bfloat16)
wd = jnp.asarray(rng.standard_normal((L, F, K)) * 0.05, jnp.bfloat16)
pg = jnp.asarray(native_amx.pack_gated(np.asarray(wg), np.asarray(wu)))
pd = jnp.asarray(native_amx.pack(np.asarray(wd)))
bits = {k: cpu_bf16.weights_as_bits(v) for k, v in dict(g=wg, u=wu, d=wd).items()}

def norm(y):
    return (y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + 1e-6)).astype(jnp.bfloat16)

def native(x, pg, pd):
    def body(x, l):
        h = jax.ffi.ffi_call("probe_gated", jax.ShapeDtypeStruct((x.shape[0], F), jnp.bfloat16))(
            x, pg, l, act=np.int32(0))
        y = jax.ffi.ffi_call("probe_gemm", jax.ShapeDtypeStruct((x.shape[0], K), jnp.float32))(h, pd, l)
        return norm(y), None
    return jax.lax.scan(body, x, jnp.arange(L, dtype=jnp.int32))[0]

def xla(x, wb):
    def body(x, w):
        g, u, d = (cpu_bf16.kv_values(w[k]) for k in "gud")
        gg = jnp.dot(x, g, preferred_element_type=jnp.float32); uu = jnp.dot(x, u, preferred_element_type=jnp.float32)
        h = (jax.nn.silu(gg) * uu).astype(jnp.bfloat16)
        return norm(jnp.dot(h, d, preferred_element_type=jnp.float32)), None
    return jax.lax.scan(body, x, wb)[0]

fn, fx = jax.jit(native), jax.jit(xla)
for M in [int(m) for m in os.environ.get("ROWS", "1 2 8 16 32 64 512").split()]:
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    a, b = np.asarray(fn(x, pg, pd), np.float32), np.asarray(fx(x, bits), np.float32)
    rel = np.abs(a - b).max() / np.abs(b).max()
    ts = {"packed": [], "xla": []}
    for _ in range(int(os.environ.get("REPS", 9))):
        for n, f in (("packed", lambda: fn(x, pg, pd)), ("xla", lambda: fx(x, bits))):
            t0 = time.perf_counter(); jax.block_until_ready(f()); ts[n].append((time.perf_counter() - t0) * 1e3)
    mp, mx = statistics.median(ts["packed"]), statistics.median(ts["xla"])
    print(f"M={M:4d}: packed {mp:7.2f} ms | xla {mx:7.2f} ms | ratio {mp/mx:.2f} | max rel diff {rel:.1e}", flush=True)
