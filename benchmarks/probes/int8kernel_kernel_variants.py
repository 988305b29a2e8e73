"""Variants of jaxinfer/kernels/cpu/csrc/int8_gemm.cc (source edits, each registered under its own target) timed
against each other on stacks of SmolLM2-shaped int8 products large enough to come from memory,
alternated in one process; ms per 30 layers. ROWS=M, VARIANTS="base ...". The edits match the
source at 9c6a52d (some no longer apply after it)."""
import logging, os, statistics, sys, time; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import numpy as np, jax, jax.numpy as jnp
from jaxinfer.kernels.cpu import build as native_build
from jaxinfer.kernels.cpu import int8 as native_int8
from jaxinfer.layers.quantization import int8 as quant
SRC = native_int8.SOURCE.read_text()
V = {
 "base": [],
 "noflush": [("    _mm512_storeu_ps(c, _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0[r]), s0, _mm512_loadu_ps(c)));\n    _mm512_storeu_ps(c + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1[r]), s1, _mm512_loadu_ps(c + 16)));",
              "    if (s0[0] == 12345.f) { _mm512_storeu_ps(c, _mm512_cvtepi32_ps(i0[r])); _mm512_storeu_ps(c+16, _mm512_cvtepi32_ps(i1[r])); }")],
 "nowiden": [("    for (int blk = 0; blk < 2; ++blk) {\n      for (int side = 0; side < 2; ++side) {", "    if (g == 0) for (int blk = 0; blk < 2; ++blk) {\n      for (int side = 0; side < 2; ++side) {")],
 "rows4": [("constexpr int kWideRows = 8;", "constexpr int kWideRows = 4;")],
 "pfw": [("    const __m512 s0 = _mm512_loadu_ps(p.s + g * p.N + 32 * q);\n    const __m512 s1 = _mm512_loadu_ps(p.s + g * p.N + 32 * q + 16);\n    for (int64_t m0",
            "    if (g + 1 < p.K / kGroup) for (int blk = 0; blk < 2; ++blk) for (int side = 0; side < 2; ++side) for (int i = 0; i < 512; i += 64) _mm_prefetch(reinterpret_cast<const char*>((side ? b1 : b0) + (2 * g + 2 + blk) * 512 + i), _MM_HINT_T0);\n    const __m512 s0 = _mm512_loadu_ps(p.s + g * p.N + 32 * q);\n    const __m512 s1 = _mm512_loadu_ps(p.s + g * p.N + 32 * q + 16);\n    for (int64_t m0")],
 "pq": [("  for (int64_t m = 0; m < M; ++m) quantize_row(x.untyped_data(), bf16, m, K, xq.data(), xs.data());",
         "  if (M >= 16) { int16_t* xqd = xq.data(); float* xsd = xs.data(); const void* xd0 = x.untyped_data(); jaxinfer::parallel_items(pool, M, [=](int64_t m) { quantize_row(xd0, bf16, m, K, xqd, xsd); }); } else for (int64_t m = 0; m < M; ++m) quantize_row(x.untyped_data(), bf16, m, K, xq.data(), xs.data());")],
 "onlyquant": [("  const int64_t pairs = N / 32;", "  if (M > 0) return ffi::Error::Success();\n  const int64_t pairs = N / 32;")],
 "two": [('    __m512i i0[R], i1[R];\n    for (int r = 0; r < R; ++r) i0[r] = i1[r] = _mm512_setzero_si512();\n    for (int64_t b = 2 * g; b < 2 * g + 2; ++b) {\n      const int8_t* w0 = b0 + b * 512;\n      const int8_t* w1 = b1 + b * 512;\n      for (int pr = 0; pr < 16; ++pr) {\n        if ((pr & 1) == 0) { _mm_prefetch(reinterpret_cast<const char*>(w0 + 32 * pr + PFD), _MM_HINT_T0); _mm_prefetch(reinterpret_cast<const char*>(w1 + 32 * pr + PFD), _MM_HINT_T0); }\n        const __m512i v0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + 32 * pr)));\n        const __m512i v1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1 + 32 * pr)));\n        for (int r = 0; r < R; ++r) {\n          int32_t pair;\n          std::memcpy(&pair, a + r * p.K + 32 * b + 2 * pr, sizeof(pair));\n          const __m512i xv = _mm512_set1_epi32(pair);\n          i0[r] = _mm512_dpwssd_epi32(i0[r], xv, v0);\n          i1[r] = _mm512_dpwssd_epi32(i1[r], xv, v1);\n        }\n      }\n    }\n', '    __m512i i0[R], i1[R], j0[R], j1[R];\n    for (int r = 0; r < R; ++r) i0[r] = i1[r] = j0[r] = j1[r] = _mm512_setzero_si512();\n    const int8_t* w0 = b0 + 2 * g * 512;\n    const int8_t* w1 = b1 + 2 * g * 512;\n    for (int pr = 0; pr < 16; ++pr) {\n      if ((pr & 1) == 0) { _mm_prefetch(reinterpret_cast<const char*>(w0 + 32 * pr + PFD), _MM_HINT_T0); _mm_prefetch(reinterpret_cast<const char*>(w1 + 32 * pr + PFD), _MM_HINT_T0); _mm_prefetch(reinterpret_cast<const char*>(w0 + 512 + 32 * pr + PFD), _MM_HINT_T0); _mm_prefetch(reinterpret_cast<const char*>(w1 + 512 + 32 * pr + PFD), _MM_HINT_T0); }\n      const __m512i v0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + 32 * pr)));\n      const __m512i v1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1 + 32 * pr)));\n      const __m512i u0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + 512 + 32 * pr)));\n      const __m512i u1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1 + 512 + 32 * pr)));\n      for (int r = 0; r < R; ++r) {\n        int32_t pa, pb;\n        std::memcpy(&pa, a + r * p.K + 64 * g + 2 * pr, sizeof(pa));\n        std::memcpy(&pb, a + r * p.K + 64 * g + 32 + 2 * pr, sizeof(pb));\n        const __m512i xa = _mm512_set1_epi32(pa), xb = _mm512_set1_epi32(pb);\n        i0[r] = _mm512_dpwssd_epi32(i0[r], xa, v0);\n        i1[r] = _mm512_dpwssd_epi32(i1[r], xa, v1);\n        j0[r] = _mm512_dpwssd_epi32(j0[r], xb, u0);\n        j1[r] = _mm512_dpwssd_epi32(j1[r], xb, u1);\n      }\n    }\n    for (int r = 0; r < R; ++r) { i0[r] = _mm512_add_epi32(i0[r], j0[r]); i1[r] = _mm512_add_epi32(i1[r], j1[r]); }\n')],
 "pf1k": [("#define PFD 2048", "#define PFD 1024")],
 "pf4k": [("#define PFD 2048", "#define PFD 4096")],
 "nopf": [("if ((pr & 1) == 0) { _mm_prefetch", "if (pr > 100) { _mm_prefetch")],
 "noquant": [("  for (int64_t m = 0; m < M; ++m) quantize_row(", "  for (int64_t m = 0; m < 0; ++m) quantize_row(")],
}
only = os.environ.get("VARIANTS", " ".join(V)).split()
T = {}
for n in only:
    t = SRC
    for a, b in V[n]:
        assert a in t, (n, a); t = t.replace(a, b)
    path = native_int8.SOURCE.parent / f"_probe_{n}.cc"; path.write_text(t)
    try:
        why = native_build.register(path, n, "X", {f"i8_{n}": "JaxinferInt8Gemm"}, logging.getLogger("p"))
    finally:
        path.unlink()
    assert why is None, why
    T[n] = f"i8_{n}"
rng = np.random.default_rng(0)
M = int(os.environ.get("ROWS", 32))
for K, N in [(576, 576), (1536, 576), (576, 3072)]:
    L = -(-300_000_000 // (K * N * 2))
    q, s = quant.quantize_array(jnp.asarray((rng.standard_normal((L, K, N)) * 0.05).astype(np.float32)), 1)
    pk = native_int8.pack(q, s); del q
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    fns = {}
    for n, t in T.items():
        def f(x, w, s, t=t):
            def body(c, l):
                y = jax.ffi.ffi_call(t, jax.ShapeDtypeStruct((M, N), jnp.float32))(x, w, s, l)
                return c + y[:, :1].sum(), None
            return jax.lax.scan(body, jnp.float32(0), jnp.arange(L, dtype=jnp.int32))[0]
        fns[n] = jax.jit(f); jax.block_until_ready(fns[n](x, pk["w"], pk["s"]))
    ts = {n: [] for n in fns}
    for _ in range(11):
        for n, f in fns.items():
            t0 = time.perf_counter(); jax.block_until_ready(f(x, pk["w"], pk["s"])); ts[n].append(time.perf_counter() - t0)
    print(f"K={K} N={N} M={M}: " + " | ".join(f"{n} {1e3*statistics.median(v)/L*30:.3f}" for n, v in ts.items()), flush=True)
