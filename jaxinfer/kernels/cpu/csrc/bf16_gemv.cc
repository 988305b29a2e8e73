// Few-row products against bfloat16 weights on CPU, as XLA FFI custom calls. Built and
// registered by jaxinfer/kernels/cpu/gemv.py; called from jaxinfer/layers/cpu_bf16.py for the
// one- and two-row products of one or two decoding streams where no packed weights are passed
// (a CPU with neither AMX nor AVX-512 BF16; with either, amx_gemm.cc takes them over packed weights).
//
// Why: XLA:CPU (jax 0.10.2) runs a one-row bfloat16 dot on a slow path, and its two-row form
// reads the weights at ~7 GB/s (benchmarks/results/2026-12-02-cpu2-bf16/). A lone stream reads
// every weight once per token, so its step is bound by how fast the weights stream in. These
// loops read each weight once, convert it to float32 in registers (a bfloat16 is the high half
// of a float32) and multiply-add into float32 sums: bfloat16 operands, float32 accumulation,
// the same products as lax.dot_general with preferred_element_type=float32 (sums in another
// order). Runs of weight rows (kn: partial sums, added at the end; nk: output rows) are
// spread over XLA's intra-op thread pool.
//
// Targets (row-major; x and w are bfloat16 bits, u16 or bf16 buffers):
//   "jaxinfer_bf16_gemv_kn": x [M, K], w [K, N] -> y f32 [M, N], y = x w     (DenseGeneral's kernel)
//   "jaxinfer_bf16_gemv_nk": x [M, K], w [N, K] -> y f32 [M, N], y = x w^T   (a tied embedding)
// M is 1 or 2.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "parallel_items.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using jaxinfer::parallel_items;

namespace {

constexpr int kMaxRows = 2;
constexpr int64_t kItemRows = 64;    // kn: weight rows per work item; nk: output rows per work item
constexpr int kRowsAtOnce = 8;       // kn: weight rows per pass over the partial sums

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Columns that the vector loop takes (whole groups of 32); the rest run in the scalar loop.
inline int64_t grouped_columns(int64_t n) {
#ifdef __AVX512F__
  return 32 * (n / 32);
#else
  return 0 * n;
#endif
}

struct Problem {
  const uint16_t* x;
  const uint16_t* w;
  float* y;
  int64_t M, K, N;
};

// Partial sums over the weight rows [k0, k1) of x [M, K] times w [K, N], into part [M, N].
// Those rows are one contiguous run of memory, read front to back. The sums of a row of x stay
// in `part` (N float32, in L1), eight weight rows at a time. With AVX-512 the columns go 32 at a
// time: the even columns of a 32-wide load are its 32-bit lanes shifted left by 16, the odd ones
// the lanes with the low half cleared (a bfloat16 is the high half of a float32), so each half
// is 16 float32 values with no shuffle; `part` keeps each group of 32 as 16 even then 16 odd
// sums, and `unpermute` restores the order.
template <int M>
void kn_rows(const Problem& p, int64_t k0, int64_t k1, float* part) {
  std::fill(part, part + M * p.N, 0.0f);
  const int64_t groups = grouped_columns(p.N) / 32;
#ifdef __AVX512F__
  const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t k = k0; k < k1; k += kRowsAtOnce) {
    const int rows = static_cast<int>(std::min<int64_t>(kRowsAtOnce, k1 - k));
    __m512 xs[kRowsAtOnce][M];
    for (int r = 0; r < rows; ++r)
      for (int m = 0; m < M; ++m) xs[r][m] = _mm512_set1_ps(bf16_to_f32(p.x[m * p.K + k + r]));
    for (int64_t g = 0; g < groups; ++g) {
      __m512 even[M], odd[M];
      for (int m = 0; m < M; ++m) {
        even[m] = _mm512_loadu_ps(part + m * p.N + 32 * g);
        odd[m] = _mm512_loadu_ps(part + m * p.N + 32 * g + 16);
      }
      for (int r = 0; r < rows; ++r) {
        // Ask for the same columns two passes ahead (measured ~3% faster than the hardware alone).
        const int64_t ahead = std::min<int64_t>(k + r + 2 * kRowsAtOnce, p.K - 1);
        _mm_prefetch(reinterpret_cast<const char*>(p.w + ahead * p.N + 32 * g), _MM_HINT_T0);
        const __m512i bits = _mm512_loadu_si512(p.w + (k + r) * p.N + 32 * g);
        const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
        const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(bits, high));
        for (int m = 0; m < M; ++m) {
          even[m] = _mm512_fmadd_ps(xs[r][m], lo, even[m]);
          odd[m] = _mm512_fmadd_ps(xs[r][m], hi, odd[m]);
        }
      }
      for (int m = 0; m < M; ++m) {
        _mm512_storeu_ps(part + m * p.N + 32 * g, even[m]);
        _mm512_storeu_ps(part + m * p.N + 32 * g + 16, odd[m]);
      }
    }
  }
#endif
  for (int64_t k = k0; k < k1; ++k)  // the columns past the last group of 32 (all without AVX-512)
    for (int64_t n = 32 * groups; n < p.N; ++n) {
      const float wv = bf16_to_f32(p.w[k * p.N + n]);
      for (int m = 0; m < M; ++m) part[m * p.N + n] += bf16_to_f32(p.x[m * p.K + k]) * wv;
    }
}

// y = the sum of the items' partial sums [items, M, N], each group of 32 columns put back in
// order (column n of a group sits at (n % 2) * 16 + (n % 32) / 2 within it).
void unpermute(const Problem& p, const float* parts, int64_t items) {
  const int64_t grouped = grouped_columns(p.N);
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      const int64_t at = n < grouped ? (n / 32) * 32 + (n % 2) * 16 + (n % 32) / 2 : n;
      float s = 0.0f;
      for (int64_t i = 0; i < items; ++i) s += parts[(i * p.M + m) * p.N + at];
      p.y[m * p.N + n] = s;
    }
}

// y[:, r0:r1] of x [M, K] times w [N, K]^T: each output is a dot of two contiguous rows.
template <int M>
void nk_chunk(const Problem& p, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* row = p.w + r * p.K;
    int64_t k = 0;
    float s[M] = {};
#ifdef __AVX512F__
    const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (; k + 32 <= p.K; k += 32) {
      const __m512i wb = _mm512_loadu_si512(row + k);
      const __m512 wlo = _mm512_castsi512_ps(_mm512_slli_epi32(wb, 16));
      const __m512 whi = _mm512_castsi512_ps(_mm512_and_si512(wb, high));
      for (int m = 0; m < M; ++m) {
        const __m512i xb = _mm512_loadu_si512(p.x + m * p.K + k);
        acc[m] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(xb, 16)), wlo, acc[m]);
        acc[m] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(xb, high)), whi, acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) s[m] = _mm512_reduce_add_ps(acc[m]);
#endif
    for (; k < p.K; ++k) {
      const float wv = bf16_to_f32(row[k]);
      for (int m = 0; m < M; ++m) s[m] += bf16_to_f32(p.x[m * p.K + k]) * wv;
    }
    for (int m = 0; m < M; ++m) p.y[m * p.N + r] = s[m];
  }
}

bool sixteen_bit(const ffi::AnyBuffer& b) {
  return b.element_type() == ffi::U16 || b.element_type() == ffi::BF16;
}

ffi::Error problem(const ffi::AnyBuffer& x, const ffi::AnyBuffer& w, ffi::ResultBuffer<ffi::F32>& y, bool kn,
                   Problem* p) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || !sixteen_bit(x) || !sixteen_bit(w))
    return ffi::Error::InvalidArgument("bf16_gemv: x [M, K] and w 2-D, both bfloat16 (bits) expected");
  const int64_t M = xd[0], K = xd[1], N = kn ? wd[1] : wd[0];
  if ((kn ? wd[0] : wd[1]) != K || M < 1 || M > kMaxRows)
    return ffi::Error::InvalidArgument("bf16_gemv: contraction sizes differ, or M is not 1 or 2");
  *p = Problem{static_cast<const uint16_t*>(x.untyped_data()), static_cast<const uint16_t*>(w.untyped_data()),
               y->typed_data(), M, K, N};
  return ffi::Error::Success();
}

template <int M>
void run_kn(ffi::ThreadPool& pool, const Problem& p) {
  const int64_t items = (p.K + kItemRows - 1) / kItemRows;
  std::unique_ptr<float[]> parts(new float[items * M * p.N]);
  float* base = parts.get();
  parallel_items(pool, items, [p, base](int64_t i) {
    kn_rows<M>(p, i * kItemRows, std::min(p.K, (i + 1) * kItemRows), base + i * M * p.N);
  });
  unpermute(p, base, items);
}

template <int M>
void run_nk(ffi::ThreadPool& pool, const Problem& p) {
  const int64_t items = (p.N + kItemRows - 1) / kItemRows;
  parallel_items(pool, items, [p](int64_t i) {
    nk_chunk<M>(p, i * kItemRows, std::min(p.N, (i + 1) * kItemRows));
  });
}

ffi::Error gemv_kn(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::ResultBuffer<ffi::F32> y) {
  Problem p;
  if (ffi::Error error = problem(x, w, y, true, &p); error.failure()) return error;
  if (p.M == 1) run_kn<1>(pool, p); else run_kn<2>(pool, p);
  return ffi::Error::Success();
}

ffi::Error gemv_nk(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::ResultBuffer<ffi::F32> y) {
  Problem p;
  if (ffi::Error error = problem(x, w, y, false, &p); error.failure()) return error;
  if (p.M == 1) run_nk<1>(pool, p); else run_nk<2>(pool, p);
  return ffi::Error::Success();
}

auto binding() {
  return ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Ret<ffi::Buffer<ffi::F32>>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferBf16GemvKn, gemv_kn, binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferBf16GemvNk, gemv_nk, binding());
