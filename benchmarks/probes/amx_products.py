"""Probe: 30 scanned MLP-sized products (M x 576 x 1536, bfloat16 operands, float32 sums), the
AMX kernel over a packed stack read by layer index against XLA's dot over bit-stored slices.

Usage: python amx_products.py   (run from anywhere; uses this checkout; needs AMX)
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from jaxinfer.kernels.cpu import amx as native_amx  # noqa: E402

assert native_amx.available(), native_amx._load()
rng = np.random.default_rng(0)
D, F, L = 576, 1536, 30
DN = (((1,), (0,)), ((), ()))


def amx(x, packed):
    def body(c, layer):
        return c + 1e-3 * native_amx.matmul(c, packed, layer)[:, :D], None
    return lax.scan(body, x, jnp.arange(L))[0]


def xla(x, bits):
    def body(c, wl):
        y = lax.dot_general(c.astype(jnp.bfloat16), lax.bitcast_convert_type(wl, jnp.bfloat16), DN,
                            preferred_element_type=jnp.float32)
        return c + 1e-3 * y[:, :D] + 1e-3 * y[:, D:2 * D], None
    return lax.scan(body, x, bits)[0]


for M in (8, 32, 512):
    w = jnp.asarray(rng.standard_normal((L, D, F)) * 0.02, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((M, D)), jnp.float32)
    for name, f, arg in (("amx", jax.jit(amx), jnp.asarray(native_amx.pack(w))),
                         ("xla", jax.jit(xla), lax.bitcast_convert_type(w, jnp.uint16))):
        f(x, arg).block_until_ready()
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            f(x, arg).block_until_ready()
            times.append(time.perf_counter() - t0)
        print(f"{M} rows, {name}: {np.median(times) * 1e3:.2f} ms for {L} x ({M} x {D} x {F})")
