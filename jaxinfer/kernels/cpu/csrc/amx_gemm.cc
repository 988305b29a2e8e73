// Products against pre-packed bfloat16 weights on Intel AMX, or on VDPBF16PS (AVX-512 BF16) where
// the CPU has no AMX, as XLA FFI custom
// calls ("jaxinfer_amx_gemm", and "jaxinfer_amx_gated" for the gated MLP's first half, below).
// Built and registered by jaxinfer/kernels/cpu/amx.py; called through the amx_packed linear method
// (jaxinfer/layers/linear_methods/) for the layers' and the LM head's products, at any row
// count. One or two rows (one or two decoding streams) fill a sixteenth of an A tile, yet the tiles
// read the weights faster than an AVX-512 BF16 loop streaming the same packed blocks (VDPBF16PS,
// one block after another, 16-128 lines prefetched ahead): SmolLM2-135M's 30 layers and LM head,
// one row, alternated in one process, 22.1 ms here against 28-29 ms (two rows 24.9 against 27.5-31.4).
//
// Why: XLA:CPU (jax 0.10.2) multiplies a bfloat16 dot on AMX too (YNNPACK), but it re-packs the
// weight operand into AMX's pair-interleaved layout on every call, and under the layer scan it
// first copies each layer's slice out of the stacked weights: in a 32-row decode step of
// SmolLM2-135M the weights were read, copied, re-read and re-packed every step. Here the weights
// are packed once, at load (`native_amx.pack`), every layer in one stacked array read in place
// through the layer index: each weight is read once per step, straight into the tiles.
//
// Without AMX (AMD Zen 4 on): the same packed blocks through VDPBF16PS, up to 8 rows at a time
// (`dp_rows`). XLA's path there has the same two costs: on the 2-core AMD EPYC its 32-row decode
// step spent ~11 ms copying the layer slices, ahead of YNNPACK's own packing. Probe (SmolLM2-135M's
// MLP, 30 scanned layers, against XLA's dot over bit-stored stacks, alternated in one process):
// 1 row 4.5 against 8.4 ms, 8 rows 5.5 against 9.9, 32 rows 9.7 against 16.6, 512 rows 97.8
// against 111.1. Decode step of the model, 32 rows at context ~280, processes alternated: 38.6 and
// 30.4 against 44.3 and 51.0 ms; 8 rows 14.5 and 13.6 against 22.1 and 18.3 ms; one row alike.
//
// Layout of one layer's packed weight w [K, N] (K and N multiples of 32):
//   [N / 16, K / 32, 16, 16, 2]: block (j, b) is the 16 x 32 slice w[32b : 32b + 32, 16j : 16j + 16]
//   as AMX's B operand: row p holds, for each of its 16 columns, the pair w[32b + 2p], w[32b + 2p + 1]
//   (Intel's "VNNI" layout for TDPBF16PS).
// Inputs: x bf16 or u16 [M, K]; w u16 [L, N / 16, K / 32, 16, 16, 2]; layer s32 []; rows s32 []:
// how many of x's rows are real (clamped to [0, M]); a step is padded to its bucket, and the
// padding rows are not multiplied.
// Output: y f32 [M, N] = x w[layer] in the real rows: bfloat16 operands, float32 sums (as
// lax.dot_general with preferred_element_type=float32, summed in another order); zeros past them.
//
// Work: pairs of 16-column blocks are spread over XLA's intra-op threads; each item loops over
// the rows 32 at a time (two A tiles, four C tiles of 16 x 16 float32). The thread's tile
// configuration is saved and restored around an item, since XLA's own AMX kernels run on the
// same threads.
//
// "jaxinfer_amx_gated": the gated MLP's first half in one call, h = act(x Wg) * (x Wu) (SwiGLU,
// Shazeer 2020, with act = SiLU; GeGLU with the tanh-approximated GELU), rounded to bfloat16.
// Why: as two "jaxinfer_amx_gemm" calls, gate and up each went to memory as float32 [M, F] and
// XLA read both back for act(g) * u and the cast to bfloat16 (~7% of a 512-token prefill step);
// here each 32 x 32 float32 block of (g, u) stays in L1 and only h, half the bytes of one of
// them, is written. Probe (SmolLM2-135M's K 576, F 1536, 30 scanned layers, 8 weight stacks in
// rotation, the two ways alternated in one process,
// benchmarks/probes/prefillruns_gated_mlp_ab.py): 32 rows 11.1 -> 8.5 ms,
// 512 rows 81.0 -> 61.1 ms.
// Inputs: x, layer and rows as above; w u16 [L, 2F / 16, K / 32, 16, 16, 2]: the [K, 2F] matrix whose
// 16-column blocks alternate gate block q, up block q (`native_amx.pack_gated`), so that a
// column-block pair of the product above is (g, u) of h's columns 16q .. 16q + 15.
// Attribute: act s32, 0 = SiLU x sigmoid(x), 1 = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
// Output: h bf16 [M, F], each element act(g) * u from the float32 sums g, u, rounded to nearest
// even (as XLA's act(g) * u then astype(bfloat16), with another exp and another summing order);
// zeros past the real rows.
// Work as above; each 32-row panel's block pair goes through `panel` into a local buffer, then
// `gated_rows` (AVX-512) turns its rows into h.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "amx_tiles.h"
#include "fast_exp.h"
#include "parallel_items.h"
#include "xla/ffi/api/ffi.h"

// Every CPU with AMX-BF16 (Sapphire Rapids on) also has AVX-512 BF16, used for the gated epilogue's rounding.
// A CPU with AVX-512 BF16 and no AMX (AMD Zen 4 on) runs the same packed layout through VDPBF16PS
// (`panel` below); everything else in this file is shared by the two. JAXINFER_NO_AMX (defined by
// tests/test_native_amx.py in a copy of this file) builds that path on an AMX CPU too.
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && !defined(JAXINFER_NO_AMX)
#include <immintrin.h>
#define JAXINFER_AMX 1
#define JAXINFER_PACKED 1
#elif defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define JAXINFER_DPBF16 1
#define JAXINFER_PACKED 1
#endif

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxK = 16384;  // = native_amx.MAX_K: the widest contraction accepted (every model here is far below)

struct Problem {
  const uint16_t* x;
  const uint16_t* tail;  // x's last rows past a multiple of 32, zero-padded to 32 (nullptr: none)
  const uint16_t* w;     // this layer's packed weight
  float* y;
  int64_t M, K, N;
};

#ifdef JAXINFER_AMX
// Tiles (amx_tiles.h: each 16 rows of 64 bytes) 0-3: C (rows 0-15 / 16-31 of column blocks
// j / j + 1); 4, 5: A (rows 0-15 / 16-31); 6, 7: B (column blocks j / j + 1).
using jaxinfer::with_our_tiles;

// Weight blocks are prefetched this many K blocks (2 KB of each column-block pair) ahead of the
// tile loads. A weight block is read once per call and this CPU's L3 (105 MB) holds less than the
// model, so it comes from DRAM; a tile load cannot start before the products still reading its
// tile are done, so without prefetch every block waits out DRAM's latency. Probe (30 scanned
// products, 8 weight stacks in rotation, 0 against 4 ahead alternated in one process,
// benchmarks/probes/amxattn_amx_prefetch_ab.py): 32 x 576 x 1536
// 6.6 -> 5.2 ms, 8 rows 4.4 -> 3.7 ms, 32 x 1536 x 576 5.1 -> 4.8 ms; 512 rows alike within
// noise. 2 and 4 ahead measured alike, 8 no better. 0 turns it off.
constexpr int64_t kAhead = 4;
// The A rows of the panel (one 64-byte line per row and K block) are prefetched kAheadA K blocks
// ahead. With many rows, each item re-reads every 32-row panel of A from L2 for each of its column
// pairs, and a tile load waits for the products still reading the tile. Probe (CONSTANT=kAheadA
// with the kAhead probe above; outputs in benchmarks/results/2026-12-03-cpu2-128-requests/probes/,
// 0 against 2 ahead alternated in one process, two runs): 30 x (512 x 576 x 1536) 44.9 -> 40.7
// and 55.9 -> 49.1 ms, 512 x 1536 x 576 46.9 -> 42.1 and 65.5 -> 55.1 ms; 8 and 32 rows alike.
// 1 and 4 ahead gave less. A third run, with the machine faster, gave 512 rows alike (28.8 ms
// both): it helps when A has left L2. 0 turns it off.
constexpr int64_t kAheadA = 2;

inline void prefetch_block(const uint16_t* w0, const uint16_t* w1) {
  for (int line = 0; line < 16; ++line) {  // a block: 16 rows of 64 bytes
    _mm_prefetch(reinterpret_cast<const char*>(w0) + 64 * line, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w1) + 64 * line, _MM_HINT_T0);
  }
}

// Column blocks j, j + 1 for the first `rows` (1-32) rows of a (32-row, K) panel `a` with row
// stride `lda` (elements), into c (32 x 32 float32, row stride `ldc` floats). The tiles compute 16
// or 32 rows: rows past `rows` are the panel's zero padding (`setup`) or its next real rows.
void panel(const uint16_t* a, int64_t lda, const Problem& p, int64_t j, int64_t rows, float* c, int64_t ldc) {
  const bool full = rows > 16;
  const int64_t blocks = p.K / 32;
  const uint16_t* b0 = p.w + j * blocks * 512;
  const uint16_t* b1 = b0 + blocks * 512;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t b = 0; b < blocks; ++b) {
    if (kAhead > 0 && b + kAhead < blocks) prefetch_block(b0 + (b + kAhead) * 512, b1 + (b + kAhead) * 512);
    if (kAheadA > 0 && b + kAheadA < blocks)
      for (int r = 0; r < (full ? 32 : 16); ++r)
        _mm_prefetch(reinterpret_cast<const char*>(a + r * lda + (b + kAheadA) * 32), _MM_HINT_T0);
    _tile_loadd(4, a + b * 32, lda * 2);
    _tile_loadd(6, b0 + b * 512, 64);
    _tile_loadd(7, b1 + b * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 4, 7);
    if (full) {
      _tile_loadd(5, a + 16 * lda + b * 32, lda * 2);
      _tile_dpbf16ps(1, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(2, c + 16, ldc * 4);
  if (full) {
    _tile_stored(1, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
  }
}
#endif  // JAXINFER_AMX

#ifdef JAXINFER_DPBF16
// No tile state to set up without AMX.
template <typename Body>
void with_our_tiles(Body body) {
  body();
}

// Rows [0, R) of `a` (row stride `lda` elements) against the column-block pair whose K blocks
// start at b0 and b1, into c's first 32 columns (row stride `ldc` floats). Per pair row p of a
// K block: the two blocks' 64-byte rows are loaded once, and each row's bfloat16 pair
// (a[r][32b + 2p], a[r][32b + 2p + 1]) is broadcast to every lane, so VDPBF16PS adds
// a[r][2k] w[2k][c] + a[r][2k + 1] w[2k + 1][c] into lane c. 2R accumulators, R <= 8.
template <int R>
void dp_rows(const uint16_t* a, int64_t lda, const uint16_t* b0, const uint16_t* b1, int64_t blocks, float* c,
             int64_t ldc) {
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint16_t* w0 = b0 + b * 512;
    const uint16_t* w1 = b1 + b * 512;
    for (int q = 0; q < 16; ++q) {
      const __m512bh v0 = (__m512bh)_mm512_loadu_si512(w0 + 32 * q);
      const __m512bh v1 = (__m512bh)_mm512_loadu_si512(w1 + 32 * q);
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, a + r * lda + 32 * b + 2 * q, sizeof(pair));
        const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
        acc0[r] = _mm512_dpbf16_ps(acc0[r], x, v0);
        acc1[r] = _mm512_dpbf16_ps(acc1[r], x, v1);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc0[r]);
    _mm512_storeu_ps(c + r * ldc + 16, acc1[r]);
  }
}

constexpr int kDpRows = 8;  // rows per pass over a column-block pair (2 x 8 accumulators)

// `panel`'s contract (the AMX version above) on VDPBF16PS: only the first `rows` rows are
// computed, kDpRows at a time, each pass re-reading the pair's blocks from L1 / L2.
void panel(const uint16_t* a, int64_t lda, const Problem& p, int64_t j, int64_t rows, float* c, int64_t ldc) {
  const int64_t blocks = p.K / 32;
  const uint16_t* b0 = p.w + j * blocks * 512;
  const uint16_t* b1 = b0 + blocks * 512;
  for (int64_t r0 = 0; r0 < rows; r0 += kDpRows) {
    const uint16_t* ar = a + r0 * lda;
    float* cr = c + r0 * ldc;
    switch (std::min<int64_t>(kDpRows, rows - r0)) {
      case 1: dp_rows<1>(ar, lda, b0, b1, blocks, cr, ldc); break;
      case 2: dp_rows<2>(ar, lda, b0, b1, blocks, cr, ldc); break;
      case 3: dp_rows<3>(ar, lda, b0, b1, blocks, cr, ldc); break;
      case 4: dp_rows<4>(ar, lda, b0, b1, blocks, cr, ldc); break;
      case 5: dp_rows<5>(ar, lda, b0, b1, blocks, cr, ldc); break;
      case 6: dp_rows<6>(ar, lda, b0, b1, blocks, cr, ldc); break;
      case 7: dp_rows<7>(ar, lda, b0, b1, blocks, cr, ldc); break;
      default: dp_rows<8>(ar, lda, b0, b1, blocks, cr, ldc); break;
    }
  }
}
#endif  // JAXINFER_DPBF16

#ifdef JAXINFER_PACKED

// Column-block pairs [q0, q1) (pair q: blocks 2q, 2q + 1) for every row.
void columns(const Problem& p, int64_t q0, int64_t q1) {
  alignas(64) float c[32 * 32];
  with_our_tiles([&] {
    for (int64_t m0 = 0; m0 < p.M; m0 += 32) {
      const int64_t rows = std::min<int64_t>(32, p.M - m0);
      const uint16_t* a = rows < 32 ? p.tail : p.x + m0 * p.K;
      for (int64_t q = q0; q < q1; ++q) {
        if (rows == 32) {
          panel(a, p.K, p, 2 * q, 32, p.y + m0 * p.N + 32 * q, p.N);
          continue;
        }
        panel(a, p.K, p, 2 * q, rows, c, 32);
        for (int64_t r = 0; r < rows; ++r) std::memcpy(p.y + (m0 + r) * p.N + 32 * q, c + r * 32, 32 * sizeof(float));
      }
    }
  });
}

// ---- The gated epilogue ("jaxinfer_amx_gated").
enum Act : int32_t { kSilu = 0, kGeluTanh = 1 };

using jaxinfer::exp16;  // fast_exp.h: exp of 16 lanes, clamped to [-87, 88]

// act(g) of 16 lanes as g sigmoid(z), sigmoid(z) = 1 / (1 + exp(-z)) with a true division (a few
// float32 ulps): SiLU's z = g; the tanh GELU's z = 2 sqrt(2 / pi) (g + 0.044715 g^3), since
// 0.5 (1 + tanh(y)) = sigmoid(2y). That form has no 1 + tanh(y) to cancel for negative g (there
// 1 - 2 / (exp(2y) + 1) would lose most digits of a small 1 + tanh(y)). exp16's clamp keeps
// 1 + exp(-z) finite for any g, so the sigmoid is in [0, 1]: no inf, no NaN.
template <Act A>
inline __m512 act16(__m512 g) {
  __m512 z = g;
  if (A == kGeluTanh) {
    constexpr float kC1 = 1.5957691216057308f;        // 2 sqrt(2 / pi)
    constexpr float kC3 = 1.5957691216057308f * 0.044715f;
    z = _mm512_mul_ps(g, _mm512_fmadd_ps(_mm512_mul_ps(g, g), _mm512_set1_ps(kC3), _mm512_set1_ps(kC1)));
  }
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), z));
  return _mm512_mul_ps(g, _mm512_div_ps(one, _mm512_add_ps(one, e)));
}

// 16 float32 lanes -> 16 bfloat16, rounded to nearest even (NaN stays NaN).
inline __m256i to_bf16(__m512 h) { return (__m256i)_mm512_cvtneps_pbh(h); }

// Rows [0, rows) of a 32 x 32 float32 block c (row r: g = c[r][0:16], u = c[r][16:32]) -> h's
// 16 bfloat16 act(g) * u at h + r * ldh.
template <Act A>
void gated_rows(const float* c, int64_t rows, uint16_t* h, int64_t ldh) {
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 g = _mm512_load_ps(c + 32 * r), u = _mm512_load_ps(c + 32 * r + 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + r * ldh), to_bf16(_mm512_mul_ps(act16<A>(g), u)));
  }
}

// Gate/up pairs [q0, q1) for every row, into h [M, F] (F = N / 2).
template <Act A>
void gated_columns(const Problem& p, uint16_t* h, int64_t q0, int64_t q1) {
  alignas(64) float c[32 * 32];
  const int64_t F = p.N / 2;
  with_our_tiles([&] {
    for (int64_t m0 = 0; m0 < p.M; m0 += 32) {
      const int64_t rows = std::min<int64_t>(32, p.M - m0);
      const uint16_t* a = rows < 32 ? p.tail : p.x + m0 * p.K;
      for (int64_t q = q0; q < q1; ++q) {
        panel(a, p.K, p, 2 * q, rows, c, 32);
        gated_rows<A>(c, rows, h + m0 * F + 16 * q, F);
      }
    }
  });
}

// Checks x, w and layer (`name` starts the messages) and sets p up for that layer and x's real
// rows (p.M: `rows`, clamped to [0, M]): those past a multiple of 32 copied, zero-padded to a
// whole panel, into `tail` once for every item (on AMX; the VDPBF16PS path reads them in place).
ffi::Error setup(const char* name, ffi::AnyBuffer x, ffi::Buffer<ffi::U16> w, ffi::Buffer<ffi::S32> layer,
                 ffi::Buffer<ffi::S32> rows, std::vector<uint16_t>& tail, Problem& p) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 6 || wd[3] != 16 || wd[4] != 16 || wd[5] != 2 ||
      (x.element_type() != ffi::U16 && x.element_type() != ffi::BF16))
    return ffi::Error::InvalidArgument(std::string(name) +
                                       ": x bf16 [M, K] and w u16 [L, N/16, K/32, 16, 16, 2] expected");
  const int64_t L = wd[0], N = wd[1] * 16, K = wd[2] * 32;
  const int64_t M = std::clamp<int64_t>(rows.typed_data()[0], 0, xd[0]);
  const int64_t l = layer.typed_data()[0];
  if (xd[1] != K || K > kMaxK || N % 32 != 0 || l < 0 || l >= L)
    return ffi::Error::InvalidArgument(std::string(name) +
                                       ": K differs from x's, exceeds the limit, N is not a multiple of 32 "
                                       "or the layer is out of range");
  const auto* xs = static_cast<const uint16_t*>(x.untyped_data());
  const int64_t whole = M / 32 * 32;
#ifdef JAXINFER_DPBF16
  // VDPBF16PS reads only the real rows (`panel`): the last rows are read in place, not padded.
  p = Problem{xs, M > whole ? xs + whole * K : nullptr, w.typed_data() + l * N * K, nullptr, M, K, N};
#else
  tail.assign(M > whole ? 32 * K : 0, 0);
  std::copy(xs + whole * K, xs + M * K, tail.data());
  p = Problem{xs, tail.empty() ? nullptr : tail.data(), w.typed_data() + l * N * K, nullptr, M, K, N};
#endif
  return ffi::Error::Success();
}

// Zeros in rows [from, to) of a row-major [*, n] array of T.
template <typename T>
void zero_rows(T* a, int64_t from, int64_t to, int64_t n) {
  if (to > from) std::memset(a + from * n, 0, (to - from) * n * sizeof(T));
}

// Runs item(q0, q1) over [0, pairs) column-block pairs, about 8 items per thread.
template <typename Item>
void spread(ffi::ThreadPool& pool, int64_t pairs, Item item) {
  const int64_t per_item = std::max<int64_t>(1, pairs / (8 * std::max<int64_t>(1, pool.num_threads())));
  const int64_t items = (pairs + per_item - 1) / per_item;
  jaxinfer::parallel_items(pool, items, [item, per_item, pairs](int64_t i) {
    item(i * per_item, std::min(pairs, (i + 1) * per_item));
  });
}
#endif

ffi::Error gemm(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::U16> w, ffi::Buffer<ffi::S32> layer,
                ffi::Buffer<ffi::S32> rows, ffi::ResultBuffer<ffi::F32> y) {
#ifdef JAXINFER_PACKED
  std::vector<uint16_t> tail;
  Problem p;
  if (ffi::Error err = setup("amx_gemm", x, w, layer, rows, tail, p); err.failure()) return err;
  p.y = y->typed_data();
  zero_rows(p.y, p.M, x.dimensions()[0], p.N);
  if (p.M > 0) spread(pool, p.N / 32, [p](int64_t q0, int64_t q1) { columns(p, q0, q1); });
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("amx_gemm: built without AMX or AVX-512 BF16 (the CPU or the compiler lacks both)");
#endif
}

ffi::Error gated(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::U16> w, ffi::Buffer<ffi::S32> layer,
                 ffi::Buffer<ffi::S32> rows, int32_t act, ffi::ResultBuffer<ffi::BF16> h) {
#ifdef JAXINFER_PACKED
  std::vector<uint16_t> tail;
  Problem p;
  if (ffi::Error err = setup("amx_gated", x, w, layer, rows, tail, p); err.failure()) return err;
  const auto hd = h->dimensions();
  if (hd.size() != 2 || hd[0] != x.dimensions()[0] || hd[1] != p.N / 2 || (act != kSilu && act != kGeluTanh))
    return ffi::Error::InvalidArgument("amx_gated: h must be bf16 [M, N/2] and act 0 (SiLU) or 1 (tanh GELU)");
  uint16_t* out = h->typed_data();  // bfloat16 bits
  zero_rows(out, p.M, hd[0], p.N / 2);
  if (p.M == 0) return ffi::Error::Success();
  if (act == kSilu)
    spread(pool, p.N / 32, [p, out](int64_t q0, int64_t q1) { gated_columns<kSilu>(p, out, q0, q1); });
  else
    spread(pool, p.N / 32, [p, out](int64_t q0, int64_t q1) { gated_columns<kGeluTanh>(p, out, q0, q1); });
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("amx_gated: built without AMX or AVX-512 BF16 (the CPU or the compiler lacks both)");
#endif
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferAmxGemm, gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()           // x
                                  .Arg<ffi::Buffer<ffi::U16>>()    // packed w
                                  .Arg<ffi::Buffer<ffi::S32>>()    // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()    // rows (real rows of x)
                                  .Ret<ffi::Buffer<ffi::F32>>());  // y

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferAmxGated, gated,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()            // x
                                  .Arg<ffi::Buffer<ffi::U16>>()     // packed [wg | wu] blocks
                                  .Arg<ffi::Buffer<ffi::S32>>()     // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()     // rows (real rows of x)
                                  .Attr<int32_t>("act")             // 0 SiLU, 1 tanh GELU
                                  .Ret<ffi::Buffer<ffi::BF16>>());  // h
