"""AMX product kernel variants in a lone stream's product sequence (SmolLM2-135M: per layer q, k, v,
o, gate_up (gated), down over 30 layers, then the tied head; 269 MB of weights, more than L3),
alternated in one process. Usage: seq_variants.py [ROWS env: 1]"""
import logging, os, sys, time, statistics as st
import jax, jax.numpy as jnp, numpy as np
from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.kernels.cpu import build as native_build
assert native_amx.available()
src = native_amx.SOURCE.read_text()
def prologue(s):  # prefetch the first kAhead blocks of both column blocks before the loop
    old = "  _tile_zero(0);\n  _tile_zero(1);"
    assert old in s
    return s.replace(old, "  if (kAhead > 0)\n    for (int64_t b = 0; b < std::min<int64_t>(kAhead, blocks); ++b) prefetch_block(b0 + b * 512, b1 + b * 512);\n" + old, 1)
def ahead(n):
    return lambda s: s.replace("constexpr int64_t kAhead = 4;", f"constexpr int64_t kAhead = {n};")
VARIANTS = {"base": lambda s: s, "prologue": prologue, "prologue+ahead8": lambda s: prologue(ahead(8)(s))}
sel = os.environ.get("VARIANTS")
if sel: VARIANTS = {k: VARIANTS[k] for k in sel.split(",")}
targets = {}
for name, f in VARIANTS.items():
    v = f(src)
    assert name == "base" or v != src, name
    tag = name.replace("+", "_")
    path = native_amx.SOURCE.parent / f"_probe_{tag}.cc"
    path.write_text(v)
    try:
        why = native_build.register(path, "probe " + name, "JAXINFER_NATIVE_AMX",
                                    {"probe_" + tag: "JaxinferAmxGemm", "probe_g_" + tag: "JaxinferAmxGated"}, logging.getLogger("p"))
    finally:
        path.unlink()
    assert why is None, why
    targets[name] = ("probe_" + tag, "probe_g_" + tag)
D, F, KV, V, L = 576, 1536, 192, 49152, 30
M = int(os.environ.get("ROWS", "1"))
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
        return mm(x, head, 0)
    return jax.jit(body)
fs = {v: make(*t) for v, t in targets.items()}
x = jnp.asarray(rng.standard_normal((M, D)), jnp.float32)
ref = np.asarray(fs["base"](x))
for v, f in fs.items():
    assert np.array_equal(np.asarray(f(x)), ref), v
res = {v: [] for v in fs}
for r in range(int(os.environ.get("REPS", "40"))):
    for v in (list(fs) if r % 2 else list(fs)[::-1]):
        t = time.perf_counter(); fs[v](x).block_until_ready(); res[v].append(time.perf_counter() - t)
print(M, "row(s), 30 layers + head:", " | ".join(f"{v} {st.median(t) * 1e3:.2f} ms" for v, t in res.items()), flush=True)
