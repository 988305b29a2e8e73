"""Greedy ids of R rows of SmolLM2's 49,152 logits: jnp.argmax (XLA's variadic reduce) against the
C++ loop (`jaxinfer.kernels.cpu.argmax`), alternated in one process; median of 10 rounds of 20 calls,
4 logit arrays in rotation."""
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from jaxinfer.kernels.cpu import argmax as native_argmax  # noqa: E402

assert native_argmax.available()
fns = {"jnp.argmax": jax.jit(lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32)), "C++ loop": jax.jit(native_argmax.argmax)}
rng = np.random.default_rng(0)
for R in (1, 8, 32, 512):
    xs = [jnp.asarray(rng.standard_normal((R, 49152)), jnp.float32) for _ in range(4)]
    for x in xs:
        assert np.array_equal(*(np.asarray(f(x)) for f in fns.values()))
    times = {n: [] for n in fns}
    for _ in range(10):
        for n, f in fns.items():
            t0 = time.perf_counter()
            for i in range(20):
                out = f(xs[i % 4])
            out.block_until_ready()
            times[n].append((time.perf_counter() - t0) / 20)
    print(f"{R} x 49152: " + " | ".join(f"{n} {1e3 * np.median(t):.3f} ms" for n, t in times.items()))
