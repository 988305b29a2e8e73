"""The 32-row panel loop of amx_gemm.cc with its tile loads reordered (each load issued just before
the first product that reads it, so that a load waits only for the product that last read its
tile), against this checkout's order; the product sequence of a step at ROWS rows, alternated."""
import logging, os, time, statistics as st
import jax, jax.numpy as jnp, numpy as np
from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.kernels.cpu import build as native_build
assert native_amx.available()  # also asks the kernel for tile state (else SIGILL)
src = native_amx.SOURCE.read_text()
OLD = """    _tile_loadd(4, a + b * 32, lda * 2);
    _tile_loadd(6, b0 + b * 512, 64);
    _tile_loadd(7, b1 + b * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 4, 7);
    if (full) {
      _tile_loadd(5, a + 16 * lda + b * 32, lda * 2);
      _tile_dpbf16ps(1, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }"""
NEW = """    _tile_loadd(6, b0 + b * 512, 64);
    _tile_loadd(4, a + b * 32, lda * 2);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b1 + b * 512, 64);
    _tile_dpbf16ps(2, 4, 7);
    if (full) {
      _tile_loadd(5, a + 16 * lda + b * 32, lda * 2);
      _tile_dpbf16ps(1, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }"""
assert OLD in src
targets = {}
for name, s in (("base", src), ("reordered", src.replace(OLD, NEW))):
    path = native_amx.SOURCE.parent / f"_probe_{name}.cc"
    path.write_text(s)
    try:
        why = native_build.register(path, name, "JAXINFER_NATIVE_AMX", {"probe_" + name: "JaxinferAmxGemm", "probe_g_" + name: "JaxinferAmxGated"}, logging.getLogger("p"))
    finally:
        path.unlink()
    assert why is None, why
    targets[name] = ("probe_" + name, "probe_g_" + name)
D, F, KV, V, L = 576, 1536, 192, 49152, 30
rng = np.random.default_rng(0)
def w(*s): return jnp.asarray((rng.standard_normal(s) * 0.02).astype(np.float32)).astype(jnp.bfloat16)
W = dict(q=w(L, D, D), k=w(L, D, KV), v=w(L, D, KV), o=w(L, D, D), down=w(L, F, D))
P = {n: jnp.asarray(native_amx.pack(W[n])) for n in W}
P["gu"] = jnp.asarray(native_amx.pack_gated(w(L, D, F), w(L, D, F)))
head = jnp.asarray(native_amx.pack(w(V, D).T[None]))
def make(t, tg):
    def mm(x, p, l):
        n = native_amx.packed_shape_kn(p)[1]
        return jax.ffi.ffi_call(t, jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32))(x.astype(jnp.bfloat16), p, jnp.int32(l))
    def gated(x, p, l):
        n = native_amx.packed_shape_kn(p)[1] // 2
        return jax.ffi.ffi_call(tg, jax.ShapeDtypeStruct((x.shape[0], n), jnp.bfloat16))(x.astype(jnp.bfloat16), p, jnp.int32(l), act=np.int32(0))
    def body(x):
        for l in range(L):
            q = mm(x, P["q"], l); k = mm(x, P["k"], l); v = mm(x, P["v"], l)
            x = x + 1e-3 * mm(q, P["o"], l) + k[:, :1] + v[:, :1]
            x = x + 1e-3 * mm(gated(x, P["gu"], l), P["down"], l)
        return mm(x[-1:], head, 0)
    return jax.jit(body)
fs = {n: make(*t) for n, t in targets.items()}
for M in [int(m) for m in os.environ.get("ROWS", "1,32,512").split(",")]:
    x = jnp.asarray(rng.standard_normal((M, D)), jnp.float32)
    outs = {n: np.asarray(f(x)) for n, f in fs.items()}
    assert np.array_equal(outs["base"], outs["reordered"])
    res = {n: [] for n in fs}
    for r in range(int(os.environ.get("REPS", "20"))):
        for n in (list(fs) if r % 2 else list(fs)[::-1]):
            t = time.perf_counter(); fs[n](x).block_until_ready(); res[n].append(time.perf_counter() - t)
    print(f"{M:4d} rows:", " | ".join(f"{n} {st.median(t) * 1e3:.2f} ms" for n, t in res.items()), flush=True)
