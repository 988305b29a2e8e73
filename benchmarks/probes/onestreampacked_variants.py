"""At bf8836d (the VDPBF16PS stream for 1-2 rows): the stream loop at kLinesAhead = each argv value
against the tile path for every row count, each registered under its own FFI target, 1 and 2 rows,
rotated in one process. The source edits match bf8836d's amx_gemm.cc only."""
import logging, time, statistics as st, sys
import jax, jax.numpy as jnp, numpy as np
from jaxinfer.kernels.cpu import amx as a
from jaxinfer.kernels.cpu import build as native_build
assert a.available()
base = open(a.SOURCE).read()
def tiles_src(s):
    s = s.replace("if (p.M == 1) stream_columns<1>(p, q0, q1);\n    else if (p.M == 2) stream_columns<2>(p, q0, q1);\n    else columns(p, q0, q1);", "columns(p, q0, q1);")
    s = s.replace("if (p.M == 1) gated_stream<A, 1>(p, h, q0, q1);\n  else if (p.M == 2) gated_stream<A, 2>(p, h, q0, q1);\n  else gated_columns<A>(p, h, q0, q1);", "gated_columns<A>(p, h, q0, q1);")
    return s.replace("M > whole && M > kStreamRows ? 32 * K : 0", "M > whole ? 32 * K : 0")
variants = {"tiles": tiles_src(base)}
for ahead in sys.argv[1:]:
    variants["ahead" + ahead] = base.replace("constexpr int64_t kLinesAhead = 16;", f"constexpr int64_t kLinesAhead = {ahead};")
exec(open(__file__.rsplit('/', 1)[0] + '/onestreampacked_ab2.py').read().split("sep = jax.jit")[0].replace("M = 1\n",""))
comp = {}
for name, src in variants.items():
    path = a.SOURCE.parent / f"_probe_{name}.cc"; path.write_text(src)
    try:
        why = native_build.register(path, name, "JAXINFER_NATIVE_AMX", {f"g_{name}": "JaxinferAmxGemm", f"gg_{name}": "JaxinferAmxGated"}, logging.getLogger("p"))
    finally:
        path.unlink()
    assert why is None, why
    a.TARGET, a.GATED_TARGET = f"g_{name}", f"gg_{name}"
    j = jax.jit(lambda x: body(x, False))
    comp[name] = {M: j.lower(jnp.ones((M,576), jnp.float32)).compile() for M in (1, 2)}
for M in (1, 2):
    x = jnp.ones((M,576), jnp.float32)*0.1
    res = {n: [] for n in comp}
    names = list(comp)
    for i in range(40):
        for n in names[i % len(names):] + names[:i % len(names)]:
            t=time.perf_counter(); comp[n][M](x).block_until_ready(); res[n].append(time.perf_counter()-t)
    print(M, {n: round(st.median(v)*1e3,2) for n,v in res.items()})
