"""AMX product kernel variants at 1 row (and ROWS), alternated in one process, per SmolLM2 shape:
30 dependent calls over a 30-layer stack (weights from DRAM)."""
import logging, os, re, sys, time, statistics as st
import jax, jax.numpy as jnp, numpy as np
from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.kernels.cpu import build as native_build
assert native_amx.available()
src = native_amx.SOURCE.read_text()
KEEP = '''
template <typename Body>
void with_tiles_kept(Body body) {
  alignas(64) uint8_t saved[64];
  _tile_storeconfig(saved);
  alignas(64) jaxinfer::TileConfig ours;
  for (int t = 0; t < 8; ++t) { ours.rows[t] = 16; ours.colsb[t] = 64; }
  const bool same = std::memcmp(saved, &ours, 64) == 0;
  if (!same) _tile_loadconfig(&ours);
  body();
  if (!same && saved[0] != 0) _tile_loadconfig(saved);
}
'''
def keep(s):
    s = s.replace("using jaxinfer::with_our_tiles;", "using jaxinfer::with_our_tiles;" + KEEP)
    return s.replace("with_our_tiles([&]", "with_tiles_kept([&]")
def big_items(s):  # at most 2 items per thread when M <= 2
    return s.replace("pairs / (8 * std::max<int64_t>(1, pool.num_threads()))", "pairs / (8 * std::max<int64_t>(1, pool.num_threads())) * 1")
def stride0(s):  # one row: A tile reads row 0 sixteen times (stride 0), no tail copy
    s = s.replace("  tail.assign(M > whole ? 32 * K : 0, 0);\n  std::copy(xs + whole * K, xs + M * K, tail.data());",
                  "  if (M == 1) tail.clear(); else { tail.assign(M > whole ? 32 * K : 0, 0);\n  std::copy(xs + whole * K, xs + M * K, tail.data()); }")
    s = s.replace("p = Problem{xs, tail.empty() ? nullptr : tail.data(),", "p = Problem{xs, M == 1 ? xs : tail.empty() ? nullptr : tail.data(),")
    s = s.replace("panel(a, p.K, p, 2 * q, rows > 16, c, 32);\n        for", "panel(a, p.M == 1 ? 0 : p.K, p, 2 * q, rows > 16, c, 32);\n        for")
    return s
VARIANTS = {"base": lambda s: s, "keep": keep, "stride0": stride0, "keep+stride0": lambda s: stride0(keep(s))}
targets = {}
for name, f in VARIANTS.items():
    v = f(src)
    assert name == "base" or v != src, name
    path = native_amx.SOURCE.parent / f"_probe_{name.replace('+','_')}.cc"
    path.write_text(v)
    try:
        why = native_build.register(path, "probe " + name, "JAXINFER_NATIVE_AMX", {"probe_" + name: "JaxinferAmxGemm"}, logging.getLogger("p"))
    finally:
        path.unlink()
    assert why is None, why
    targets[name] = "probe_" + name
L = 30
rng = np.random.default_rng(0)
shapes = {"q/o": (576, 576), "k/v": (576, 192), "down": (1536, 576), "gate_up": (576, 3072)}
P = {n: jnp.asarray(native_amx.pack((rng.standard_normal((L, k, nn)) * 0.02).astype(np.float32).astype(jnp.bfloat16))) for n, (k, nn) in shapes.items()}
def make(target, n):
    k, nn = shapes[n]
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((M, nn), jnp.float32))
    def f(x):
        acc = jnp.zeros((), jnp.float32)
        for i in range(L):
            y = call((x + acc).astype(jnp.bfloat16), P[n], jnp.int32(i))
            acc = acc + y[0, 0] * 1e-9
        return acc, y
    return jax.jit(f)
for M in [int(m) for m in os.environ.get("ROWS", "1").split(",")]:
    fs = {(v, n): make(t, n) for v, t in targets.items() for n in shapes}
    xs = {n: jnp.asarray(rng.standard_normal((M, shapes[n][0])), jnp.float32) for n in shapes}
    for n in shapes:
        ref = np.asarray(fs[("base", n)](xs[n])[1])
        for v in targets:
            assert np.array_equal(np.asarray(fs[(v, n)](xs[n])[1]), ref), (v, n)
    res = {k: [] for k in fs}
    for r in range(30):
        order = list(fs) if r % 2 else list(fs)[::-1]
        for k in order:
            t = time.perf_counter(); fs[k](xs[k[1]])[0].block_until_ready(); res[k].append(time.perf_counter() - t)
    for n in shapes:
        print(M, "row(s)", n, " | ".join(f"{v} {st.median(res[(v, n)]) / L * 1e6:.1f} us" for v in targets), flush=True)
    tot = {v: sum(st.median(res[(v, n)]) / L * (2 if n in ("q/o", "k/v") else 1) for n in shapes) for v in targets}
    print(M, "row(s) per layer (q,k,v,o,gate_up,down):", " | ".join(f"{v} {t*1e6:.0f} us" for v, t in tot.items()))
