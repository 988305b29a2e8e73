"""1-row AMX product per SmolLM2 shape: 30 dependent calls over the 30 layers (weights from DRAM);
time per call and weight GB/s."""
import time, statistics as st, sys, jax, jax.numpy as jnp, numpy as np
from jaxinfer.kernels.cpu import amx as a
assert a.available()
L = 30
M = int(sys.argv[1]) if len(sys.argv) > 1 else 1
rng = np.random.default_rng(0)
shapes = {"tiny 32x32": (32, 32), "tiny 576x32": (576, 32), "q/o 576x576": (576, 576), "k/v 576x192": (576, 192), "down 1536x576": (1536, 576),
          "gate_up 576x3072": (576, 3072), "head 576x49152": (576, 49152)}
P = {}
for n, (k, nn) in shapes.items():
    l = 1 if nn == 49152 else L
    P[n] = jnp.asarray(a.pack((rng.standard_normal((l, k, nn)) * 0.02).astype(np.float32).astype(jnp.bfloat16)))
def make(n):
    k, nn = shapes[n]
    reps = 30 if nn != 49152 else 4
    def f(x):
        acc = jnp.zeros((), jnp.float32)
        for i in range(reps):
            y = a.matmul(x + acc, P[n], i % P[n].shape[0])
            acc = acc + y[0, 0] * 0
        return acc
    return jax.jit(f), reps, k * nn * 2
fs = {n: make(n) for n in shapes}
xs = {n: jnp.ones((M, shapes[n][0]), jnp.float32) * 0.1 for n in shapes}
res = {n: [] for n in shapes}
for n in shapes: fs[n][0](xs[n]).block_until_ready()
for i in range(40):
    for n in (list(shapes) if i % 2 else list(shapes)[::-1]):
        t = time.perf_counter(); fs[n][0](xs[n]).block_until_ready(); res[n].append(time.perf_counter() - t)
for n, v in res.items():
    f, reps, b = fs[n]
    t = st.median(v) / reps
    print(f"{n:18s} {t*1e6:8.1f} us/call  {b/t/1e9:6.1f} GB/s  ({b/1e6:.2f} MB)")
