// Products against pre-packed int8 weights with group scales (`--quantization int8`), as an XLA
// FFI custom call ("jaxinfer_int8_gemm"), on AVX-512 VNNI. Built and registered by
// jaxinfer/kernels/cpu/int8.py; called through the int8_packed linear method
// (jaxinfer/layers/linear_methods/: projections, the fused q/k/v product, the LM head), at any row count.
//
// Why: XLA:CPU (jax 0.10.2) does not fuse the int8 -> float convert and the group scales into
// its dot. The int8 model's step dequantized every weight to the compute dtype, wrote it out and
// read it back for the dot: more bytes per token than the bfloat16 model, not half as many
// (docs/quantization.md: 0.88x float32's decode rate at 32 rows). Here each weight is read once,
// as int8, straight into the multiply: a lone stream reads half of bfloat16's bytes per token.
//
// The arithmetic: each row of x is quantized to int16 with its own absmax scale (a = max|x| /
// 32767, xq = round(x / a), |x - a xq| <= a / 2: 2^-16 of the row's largest value, finer than
// bfloat16's rounding of every element but the smallest); VPDPWSSD sums xq * q in int32 over
// each group of 64 inputs (|sum| <= 64 * 32767 * 127 < 2^31), and each group's sum is scaled by
// its float32 weight scale into float32 accumulators:
//   y[m, n] = a_m * sum_g s[g, n] * sum_{k in g} xq[m, k] q[k, n].
// That is the weight-only (W8A16) product that XLA's path computes as x (q s), up to the int16
// rounding of x (SmoothQuant-style per-token activation scales, Xiao et al. 2023, at 16 bits).
// (A row whose largest value is below ~4e-34 gets a scale XLA flushes to zero: its outputs are 0.)
// Exception, on a CPU with AVX-512 BF16: bfloat16 x of more than kRows (4) real rows is multiplied as
// given, each group's weights widened to bfloat16 (exact, |q| <= 127) and summed by VDPBF16PS
// in float32 (`Bf16Path`): y[m, n] = sum_g s[g, n] sum_{k in g} x[m, k] q[k, n], no rounding of x
// at all. VPDPWSSD's loop took 1.16-1.24x the bfloat16 model's decode step there.
//
// Layout of one layer's packed weight q [K, N] (K a multiple of 64, N of 32): as amx_gemm.cc's,
// with int8 elements: [N / 16, K / 32, 16, 16, 2], block (j, b) holding for each pair p of its 32
// inputs and each of its 16 columns c the two weights q[32b + 2p + e, 16j + c], e = 0, 1: one
// 32-byte run per pair, which VPMOVSXBW widens to the 32 int16 lanes VPDPWSSD pairs up.
// Inputs: x f32 or bf16 [M, K]; w s8 [L, N / 16, K / 32, 16, 16, 2]; s f32 [L, K / 64, N] (the
// scale of group g of column n); layer s32 []; rows s32 []: how many of x's rows are real
// (clamped to [0, M]; a step's padding rows are not multiplied).
// Output: y f32 [M, N], zeros past the real rows.
//
// Work: x's rows are quantized first (not on the bfloat16 path); then pairs of 16-column blocks
// are spread over XLA's intra-op threads (parallel_items.h). Up to 4 rows, an item runs them
// against its block pairs from the int8 weights as read (2 x 4 int32 and 2 x 4 float32
// accumulators in registers); past 4 rows it widens each group's weights once into L1 and runs
// the rows 8 at a time against them (`pair_wide`).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "parallel_items.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kGroup = 64;  // inputs per weight scale (jaxinfer.layers.quantization.int8.GROUP_SIZE)

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define JAXINFER_VNNI 1

constexpr int kRows = 4;  // rows per pass over a column-block pair

struct Problem {
  const int16_t* xq;  // [M, K] int16 rows (nullptr on the bfloat16 path)
  const float* xs;    // [M] row scales (nullptr: none, the bfloat16 path)
  const uint16_t* xb; // [M, K] bfloat16 x as given (the bfloat16 path), else nullptr
  const int8_t* w;    // this layer's [N / 16, K / 32, 16, 16, 2]
  const float* s;     // this layer's [K / 64, N]
  float* y;           // [M, N]
  int64_t M, K, N;
};

// 16 elements of x from i on, as float32.
inline __m512 load16(const void* x, bool bf16, int64_t i) {
  if (!bf16) return _mm512_loadu_ps(static_cast<const float*>(x) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(x) + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Row m of x -> xq[m] (int16) and its scale xs[m] (module header; K a multiple of 16). A row
// holding a NaN or an infinity gets a NaN scale, so that its outputs are NaN as XLA's would be
// (VMAXPS alone would drop a NaN lane).
void quantize_row(const void* x, bool bf16, int64_t m, int64_t K, int16_t* xq, float* xs) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t k = 0; k < K; k += 16) {
    const __m512 v = _mm512_abs_ps(load16(x, bf16, m * K + k));
    bad |= _mm512_cmp_ps_mask(v, _mm512_set1_ps(std::numeric_limits<float>::max()), _CMP_NLE_UQ);  // NaN, inf
    amax = _mm512_max_ps(amax, v);
  }
  const float mx = _mm512_reduce_max_ps(amax);
  const float a = bad ? std::numeric_limits<float>::quiet_NaN() : mx > 0.f ? mx / 32767.f : 1.f;
  const __m512 inv = _mm512_set1_ps(1.f / a);
  for (int64_t k = 0; k < K; k += 16) {  // round to nearest even; |x / a| <= 32767 (+ an ulp: saturated)
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(load16(x, bf16, m * K + k), inv));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + m * K + k), _mm512_cvtsepi32_epi16(v));
  }
  xs[m] = a;
}

// Rows [0, R) of xq against column-block pair q (columns 32q .. 32q + 31) -> y.
template <int R>
void pair_rows(const Problem& p, int64_t m0, int64_t q) {
  const int64_t blocks = p.K / 32;
  const int8_t* b0 = p.w + 2 * q * blocks * 512;
  const int8_t* b1 = b0 + blocks * 512;
  const int16_t* a = p.xq + m0 * p.K;
  __m512 f0[R], f1[R];
  for (int r = 0; r < R; ++r) f0[r] = f1[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < p.K / kGroup; ++g) {
    __m512i i0[R], i1[R];
    for (int r = 0; r < R; ++r) i0[r] = i1[r] = _mm512_setzero_si512();
    for (int64_t b = 2 * g; b < 2 * g + 2; ++b) {
      const int8_t* w0 = b0 + b * 512;
      const int8_t* w1 = b1 + b * 512;
      for (int pr = 0; pr < 16; ++pr) {
        const __m512i v0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + 32 * pr)));
        const __m512i v1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1 + 32 * pr)));
        for (int r = 0; r < R; ++r) {
          int32_t pair;
          std::memcpy(&pair, a + r * p.K + 32 * b + 2 * pr, sizeof(pair));
          const __m512i xv = _mm512_set1_epi32(pair);
          i0[r] = _mm512_dpwssd_epi32(i0[r], xv, v0);
          i1[r] = _mm512_dpwssd_epi32(i1[r], xv, v1);
        }
      }
    }
    const __m512 s0 = _mm512_loadu_ps(p.s + g * p.N + 32 * q);
    const __m512 s1 = _mm512_loadu_ps(p.s + g * p.N + 32 * q + 16);
    for (int r = 0; r < R; ++r) {
      f0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0[r]), s0, f0[r]);
      f1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1[r]), s1, f1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 xs = _mm512_set1_ps(p.xs[m0 + r]);
    float* out = p.y + (m0 + r) * p.N + 32 * q;
    _mm512_storeu_ps(out, _mm512_mul_ps(f0[r], xs));
    _mm512_storeu_ps(out + 16, _mm512_mul_ps(f1[r], xs));
  }
}

// The two ways `pair_wide` multiplies: what x's rows are, how a group's int8 weights are widened
// (512 at a time), what a group's sums accumulate in and which instruction adds to them.
struct Int16Path {  // x rounded to int16 per row (`quantize_row`), weights to int16, VPDPWSSD
  using X = int16_t;
  using Acc = __m512i;  // int32 sums
  static const X* rows(const Problem& p) { return p.xq; }
  static void widen(const int8_t* src, X* dst) {
    for (int i = 0; i < 512; i += 32)
      _mm512_storeu_si512(dst + i, _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  static Acc zero() { return _mm512_setzero_si512(); }
  static Acc dot(Acc acc, __m512i x, __m512i w) { return _mm512_dpwssd_epi32(acc, x, w); }
  static __m512 to_float(Acc acc) { return _mm512_cvtepi32_ps(acc); }
};
#ifdef __AVX512BF16__
// bfloat16 x as given, weights to bfloat16 (exact: |q| <= 127 needs 7 significant bits), VDPBF16PS.
// Used above kRows rows when x is bfloat16: on the 2-core AMD EPYC, VPDPWSSD's loop took
// 1.16-1.24x the bfloat16 model's decode step at 8-32 rows.
struct Bf16Path {
  using X = uint16_t;
  using Acc = __m512;  // float32 sums
  static const X* rows(const Problem& p) { return p.xb; }
  static void widen(const int8_t* src, X* dst) {
    for (int i = 0; i < 512; i += 32) {
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16))));
      _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc dot(Acc acc, __m512i x, __m512i w) { return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w); }
  static __m512 to_float(Acc acc) { return acc; }
};
#endif

// Rows [0, R) of a (at stride lda: 64 inputs of group g) against a group's widened weights
// (`wide`: blocks 2g, 2g + 1 of the pair's two column blocks) -> acc[r][0:32] += s (sums).
template <typename Path, int R>
void group_rows(const typename Path::X* a, int64_t lda, const typename Path::X* wide, __m512 s0, __m512 s1,
                float* acc) {
  typename Path::Acc i0[R], i1[R];
  for (int r = 0; r < R; ++r) i0[r] = i1[r] = Path::zero();
  for (int blk = 0; blk < 2; ++blk) {
    for (int pr = 0; pr < 16; ++pr) {
      const __m512i v0 = _mm512_loadu_si512(wide + blk * 1024 + 32 * pr);
      const __m512i v1 = _mm512_loadu_si512(wide + blk * 1024 + 512 + 32 * pr);
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, a + r * lda + 32 * blk + 2 * pr, sizeof(pair));
        const __m512i xv = _mm512_set1_epi32(pair);
        i0[r] = Path::dot(i0[r], xv, v0);
        i1[r] = Path::dot(i1[r], xv, v1);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    float* c = acc + 32 * r;
    _mm512_storeu_ps(c, _mm512_fmadd_ps(Path::to_float(i0[r]), s0, _mm512_loadu_ps(c)));
    _mm512_storeu_ps(c + 16, _mm512_fmadd_ps(Path::to_float(i1[r]), s1, _mm512_loadu_ps(c + 16)));
  }
}

constexpr int kWideRows = 8;  // rows per pass over a group's widened weights

// Group g's 4 KB of int8 weights of a column-block pair into L1. Without it, widening each
// group waited on memory (30 products of 32 x 1536 x 576: 3.93 against 3.51 ms with it).
inline void prefetch_group(const int8_t* b0, const int8_t* b1, int64_t g) {
  for (int blk = 0; blk < 2; ++blk)
    for (int i = 0; i < 512; i += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(b0 + (2 * g + blk) * 512 + i), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(b1 + (2 * g + blk) * 512 + i), _MM_HINT_T0);
    }
}

// Every row against column-block pair q, for M > kRows: each group's weights are widened once
// (`Path`: to int16 or bfloat16, into `wide`, 4 KB, in L1) and read by every 8-row pass; the
// float32 sums of all rows wait in `acc` [M, 32].
template <typename Path>
void pair_wide(const Problem& p, int64_t q, typename Path::X* wide, float* acc) {
  const int64_t blocks = p.K / 32;
  const int8_t* b0 = p.w + 2 * q * blocks * 512;
  const int8_t* b1 = b0 + blocks * 512;
  std::fill(acc, acc + p.M * 32, 0.f);
  for (int64_t g = 0; g < p.K / kGroup; ++g) {
    for (int blk = 0; blk < 2; ++blk)
      for (int side = 0; side < 2; ++side) Path::widen((side ? b1 : b0) + (2 * g + blk) * 512, wide + blk * 1024 + side * 512);
    if (g + 1 < p.K / kGroup) prefetch_group(b0, b1, g + 1);  // from memory while this group computes
    const __m512 s0 = _mm512_loadu_ps(p.s + g * p.N + 32 * q);
    const __m512 s1 = _mm512_loadu_ps(p.s + g * p.N + 32 * q + 16);
    for (int64_t m0 = 0; m0 < p.M; m0 += kWideRows) {
      const typename Path::X* a = Path::rows(p) + m0 * p.K + kGroup * g;
      float* c = acc + 32 * m0;
      switch (std::min<int64_t>(kWideRows, p.M - m0)) {
        case 1: group_rows<Path, 1>(a, p.K, wide, s0, s1, c); break;
        case 2: group_rows<Path, 2>(a, p.K, wide, s0, s1, c); break;
        case 3: group_rows<Path, 3>(a, p.K, wide, s0, s1, c); break;
        case 4: group_rows<Path, 4>(a, p.K, wide, s0, s1, c); break;
        case 5: group_rows<Path, 5>(a, p.K, wide, s0, s1, c); break;
        case 6: group_rows<Path, 6>(a, p.K, wide, s0, s1, c); break;
        case 7: group_rows<Path, 7>(a, p.K, wide, s0, s1, c); break;
        default: group_rows<Path, 8>(a, p.K, wide, s0, s1, c); break;
      }
    }
  }
  for (int64_t m = 0; m < p.M; ++m) {
    const __m512 xs = _mm512_set1_ps(p.xs ? p.xs[m] : 1.f);
    float* out = p.y + m * p.N + 32 * q;
    _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_loadu_ps(acc + 32 * m), xs));
    _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_loadu_ps(acc + 32 * m + 16), xs));
  }
}

// Column-block pairs [q0, q1) for every row.
void columns(const Problem& p, int64_t q0, int64_t q1) {
  if (p.M > kRows) {
    alignas(64) int16_t wide[4 * 512];
    thread_local std::vector<float> acc;
    if (acc.size() < size_t(p.M * 32)) acc.resize(p.M * 32);
#ifdef __AVX512BF16__
    if (p.xb) {
      for (int64_t q = q0; q < q1; ++q) pair_wide<Bf16Path>(p, q, reinterpret_cast<uint16_t*>(wide), acc.data());
      return;
    }
#endif
    for (int64_t q = q0; q < q1; ++q) pair_wide<Int16Path>(p, q, wide, acc.data());
    return;
  }
  for (int64_t q = q0; q < q1; ++q) {
    switch (p.M) {
      case 1: pair_rows<1>(p, 0, q); break;
      case 2: pair_rows<2>(p, 0, q); break;
      case 3: pair_rows<3>(p, 0, q); break;
      default: pair_rows<4>(p, 0, q); break;
    }
  }
}
#endif  // AVX-512 VNNI

ffi::Error gemm(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::S8> w, ffi::Buffer<ffi::F32> s,
                ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> rows, ffi::ResultBuffer<ffi::F32> y) {
#ifdef JAXINFER_VNNI
  const auto xd = x.dimensions(), wd = w.dimensions(), sd = s.dimensions();
  const bool bf16 = x.element_type() == ffi::BF16;
  if (xd.size() != 2 || wd.size() != 6 || wd[3] != 16 || wd[4] != 16 || wd[5] != 2 || sd.size() != 3 ||
      (!bf16 && x.element_type() != ffi::F32))
    return ffi::Error::InvalidArgument(
        "int8_gemm: x f32 or bf16 [M, K], w s8 [L, N/16, K/32, 16, 16, 2] and s f32 [L, K/64, N] expected");
  const int64_t L = wd[0], N = wd[1] * 16, K = wd[2] * 32;
  const int64_t M = std::clamp<int64_t>(rows.typed_data()[0], 0, xd[0]);
  const int64_t l = layer.typed_data()[0];
  if (xd[1] != K || K % kGroup != 0 || N % 32 != 0 || sd[0] != L || sd[1] != K / kGroup || sd[2] != N || l < 0 ||
      l >= L)
    return ffi::Error::InvalidArgument(
        "int8_gemm: K differs from x's or is not a multiple of 64, N is not a multiple of 32, s's shape "
        "does not match w's, or the layer is out of range");
  if (xd[0] > M) std::memset(y->typed_data() + M * N, 0, (xd[0] - M) * N * sizeof(float));
  if (M == 0) return ffi::Error::Success();
  Problem p{nullptr, nullptr, nullptr, w.typed_data() + l * N * K, s.typed_data() + l * (K / kGroup) * N,
            y->typed_data(), M, K, N};
#ifdef __AVX512BF16__
  if (bf16 && M > kRows) p.xb = static_cast<const uint16_t*>(x.untyped_data());  // `Bf16Path`
#endif
  thread_local std::vector<int16_t> xq;  // grown, never shrunk: no allocation or zeroing per call
  thread_local std::vector<float> xs;
  if (!p.xb) {
    if (xq.size() < size_t(M * K)) xq.resize(M * K);
    if (xs.size() < size_t(M)) xs.resize(M);
    for (int64_t m = 0; m < M; ++m) quantize_row(x.untyped_data(), bf16, m, K, xq.data(), xs.data());
    p.xq = xq.data();
    p.xs = xs.data();
  }
  const int64_t pairs = N / 32;
  const int64_t per_item = std::max<int64_t>(1, pairs / (8 * std::max<int64_t>(1, pool.num_threads())));
  const int64_t items = (pairs + per_item - 1) / per_item;
  jaxinfer::parallel_items(pool, items, [p, per_item, pairs](int64_t i) {
    columns(p, i * per_item, std::min(pairs, (i + 1) * per_item));
  });
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("int8_gemm: built without AVX-512 VNNI (the CPU or the compiler lacks it)");
#endif
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferInt8Gemm, gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()           // x
                                  .Arg<ffi::Buffer<ffi::S8>>()     // packed w
                                  .Arg<ffi::Buffer<ffi::F32>>()    // group scales
                                  .Arg<ffi::Buffer<ffi::S32>>()    // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()    // rows (real rows of x)
                                  .Ret<ffi::Buffer<ffi::F32>>());  // y
