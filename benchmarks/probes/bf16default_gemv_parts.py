import sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import jax, jax.numpy as jnp, numpy as np
from jaxinfer.kernels.cpu import gemv as native_gemv
assert native_gemv.available()
rng = np.random.default_rng(0)
def bf(*s): return jnp.asarray(rng.standard_normal(s) * 0.02, jnp.bfloat16)
def bench(f, *a, n=30):
    f(*a).block_until_ready(); ts = []
    for _ in range(n):
        t = time.perf_counter(); f(*a).block_until_ready(); ts.append(time.perf_counter() - t)
    return np.median(ts) * 1e3
x = bf(1, 576); x2 = bf(1, 1536)
emb = bf(49152, 576)
print("nk lm head 56.6MB: %.2f ms" % bench(jax.jit(native_gemv.matmul_nk), x, emb))
for (K, N) in [(576, 1536), (1536, 576), (576, 576), (576, 192)]:
    ws = [bf(K, N) for _ in range(30)]
    xx = x if K == 576 else x2
    f = jax.jit(lambda xx, ws: sum(native_gemv.matmul_kn(xx, w) for w in ws))
    ms = bench(f, xx, ws); mb = 30 * K * N * 2 / 1e6
    print(f"kn {K}x{N} x30 ({mb:.0f} MB): {ms:.2f} ms = {mb/ms:.1f} GB/s")
big = jnp.asarray(rng.standard_normal(64 * 2**20 // 4), jnp.float32)

ws = [bf(64, 64) for _ in range(150)]
x64 = bf(1, 64)
f = jax.jit(lambda xx, ws: sum(native_gemv.matmul_kn(xx, w) for w in ws))
print("150 tiny calls: %.2f ms" % bench(f, x64, ws))
g = jax.jit(lambda xx, ws: sum(jax.lax.dot_general(jnp.concatenate([xx, xx]), w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)[:1] for w in ws))
print("150 tiny xla dots: %.2f ms" % bench(g, x64, ws))
