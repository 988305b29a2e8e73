"""Native one-row bf16 product vs XLA's two-row form: correctness and a 30-layer chain timing."""
import os, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import jax, jax.numpy as jnp, numpy as np
from jaxinfer.kernels.cpu import gemv as native_gemv
assert native_gemv.available()
rng = np.random.default_rng(0)
def bf(a): return jnp.asarray(a, jnp.bfloat16)
for (M, K, N) in [(1, 576, 1536), (2, 576, 192), (1, 1536, 576), (1, 100, 77), (2, 33, 130)]:
    x = bf(rng.standard_normal((M, K))); w = bf(rng.standard_normal((K, N)))
    ref = jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    got = jax.jit(native_gemv.matmul_kn)(x, jax.lax.bitcast_convert_type(w, jnp.uint16))
    got2 = jax.jit(native_gemv.matmul_kn)(x, w)
    wt = bf(rng.standard_normal((N, K)))
    ref_nk = jnp.einsum("mk,nk->mn", x, wt, preferred_element_type=jnp.float32)
    got_nk = jax.jit(native_gemv.matmul_nk)(x, wt)
    print(M, K, N, float(jnp.abs(got - ref).max()), float(jnp.abs(got2 - ref).max()), float(jnp.abs(got_nk - ref_nk).max()), float(jnp.abs(ref).max()))
L = 30
ws = [(bf(rng.standard_normal((576, 1536)) * 0.02), bf(rng.standard_normal((576, 1536)) * 0.02), bf(rng.standard_normal((1536, 576)) * 0.02),
       bf(rng.standard_normal((576, 960)) * 0.02), bf(rng.standard_normal((576, 576)) * 0.02)) for _ in range(L)]
emb = bf(rng.standard_normal((49152, 576)) * 0.02)
def chain(x, ws, emb, native):
    for g, u, d, qkv, o in ws:
        if native:
            mm = native_gemv.matmul_kn
        else:
            mm = lambda a, b: jax.lax.dot_general(jnp.concatenate([a, a]).astype(jnp.bfloat16), b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)[:1]
        h = mm(x, qkv); x = x + mm(h[:, :576], o)
        x = x + mm(jax.nn.silu(mm(x, g)) * mm(x, u), d)
    if native:
        return native_gemv.matmul_nk(x, emb)
    return jnp.einsum("mk,nk->mn", jnp.concatenate([x, x]).astype(jnp.bfloat16), emb, preferred_element_type=jnp.float32)[:1]
x0 = jnp.asarray(rng.standard_normal((1, 576)), jnp.float32)
byts = sum(a.size * 2 for t in ws for a in t) + emb.size * 2
for native in (False, True, False, True):
    f = jax.jit(lambda x, ws, emb: chain(x, ws, emb, native))
    out = f(x0, ws, emb).block_until_ready()
    ts = []
    for _ in range(20):
        t = time.perf_counter(); f(x0, ws, emb).block_until_ready(); ts.append(time.perf_counter() - t)
    med = np.median(ts) * 1e3
    print(f"native={native}: median {med:.1f} ms, min {min(ts)*1e3:.1f} ms, {byts/1e6:.0f} MB -> {byts/np.median(ts)/1e9:.1f} GB/s")
