// Paged attention on CPU (one query, or a run of a prompt chunk's queries, per work item), as an
// XLA FFI custom call ("jaxinfer_paged_decode"). Built and registered by
// jaxinfer/native_attention.py; called from jaxinfer/attention.py (_native_paged_attention) for
// every token of a step, decode and prefill alike, after the step's K/V were written: a "row"
// below is one query with its own block table and the number of positions it sees (its position
// + 1). Outputs are the (max, sum, weighted values) partial softmax; attention.py divides.
//
// Why: XLA:CPU reads the pages in several passes (gather, transpose, tiny batched dots), and its
// scores of a step's new tokens grow with the square of the step's tokens; this reads each key
// and value row of a row's context once, straight from its pages, with an online softmax per
// page (FlashAttention's running max/sum, Dao et al. 2022; PagedAttention's block tables, Kwon et
// al. 2023). One work item is one row with all its heads, so each page is read as one contiguous
// run (reading one KV head's strided slice per item was ~1.5x slower here). Rows are spread over
// XLA's intra-op thread pool. Consecutive queries of one prompt chunk (same pages, next position)
// form one work item instead (`plan_runs`, up to 16): with float or bfloat16 pages of 16 tokens
// their scores are computed 16 keys by 12 (query, head) pairs at a time (`attend_tile`), each page
// widened once for the run (the kernel alone: 3.3 against 4.2 ms for a 512-token prompt's layer).
// A decode row's page: the online softmax of each head's 16 scores in one vector
// (`online_softmax16`), and with head dim 64 each value row converted once for its G <= 4 heads
// (`page_values_group`): 32 rows at context ~281, all 30 layers, 13 against 19 ms.
// With bfloat16 pages on a CPU with AMX (and JAXINFER_NATIVE_AMX not 0), a run's two products
// go to the tile unit instead (`attend_tile_amx`, 32 keys per block, Q and P rounded to
// bfloat16): a 512-token prompt's 30 layers, 79 against 200 ms. Runs there hold up to 64
// queries (kMaxAmxRun), so that each block's keys and values are laid out for the tiles once per
// 64 queries instead of per 16: the kernel alone 57-73 against 73-86 ms, prefill of 16 x 512
// 1,708 against 1,444 prompt tok/s (benchmarks/results/2026-12-03-cpu2-prefill-runs/). Decode rows stay on AVX-512:
// their scores on AMX (keys as stored as the A operand, the query as B) were no faster, 24.3
// against 19.7 ms for 32 rows at context ~281 (13.8 against 12.8 with the pages in cache).
//
// Inputs (row-major):
//   q       f32 [R, K, G, H]   scaled query of each row
//   k_cache f32 or u16 (bfloat16 bits) [L, NB, bs, K, H]; v_cache the same
//   (target "jaxinfer_paged_decode_8bit": s8 or f8e4m3fn values, then k_scales and v_scales
//    u16 bfloat16 bits [L, NB, bs, K], one per token and KV head, multiplied into the scores
//    and the probabilities)
//   layer   s32 []             layer index into the caches
//   tables  s32 [R, W]         block table of each row
//   ctx     s32 [R]            positions to read, [0, ctx) (0: none, a padding row)
//   q_pos   s32 [R]            position of each row's query (for the sliding window)
//   window  s32 []             sliding window (keys with q_pos - k_pos < window), <= 0: none
// Outputs: m f32 [R, K, G] running max (-inf for no key), l f32 [R, K, G] sum of exp(s - m),
//   acc f32 [R, K, G, H] sum of exp(s - m) * v.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <sys/syscall.h>
#include <unistd.h>

#include "parallel_items.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxHeads = 64, kMaxHeadDim = 256, kMaxBlockSize = 256;  // = native_attention.LIMITS
inline float to_float(float x) { return x; }
inline float to_float(uint16_t bits) {  // bfloat16: the high half of a float32
  const uint32_t wide = uint32_t(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}
// float8_e4m3fn (OCP): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN.
struct Fp8E4M3 {
  uint8_t bits;
};
inline float fp8_e4m3_value(uint8_t b) {
  const int exponent = (b >> 3) & 0xF, mantissa = b & 0x7;
  float out = exponent == 0 ? std::ldexp(float(mantissa), -9)  // subnormal: m / 8 * 2^-6
                            : std::ldexp(1.f + mantissa / 8.f, exponent - 7);
  if (exponent == 0xF && mantissa == 0x7) out = std::numeric_limits<float>::quiet_NaN();
  return (b & 0x80) ? -out : out;
}
struct Fp8Table {
  float value[256];
  Fp8Table() {
    for (int b = 0; b < 256; ++b) value[b] = fp8_e4m3_value(uint8_t(b));
  }
};
const Fp8Table kFp8;
inline float to_float(int8_t x) { return float(x); }
inline float to_float(Fp8E4M3 x) { return kFp8.value[x.bits]; }

struct Shape {
  int64_t R, K, G, H, NB, bs, W;
};
struct Inputs {
  const float* q;
  const void* k;
  const void* v;
  int64_t layer;
  const int32_t* tables;
  const int32_t* ctx;
  const int32_t* q_pos;
  int32_t window;
  float* m;
  float* l;
  float* acc;
  const uint16_t* k_scales;  // 8-bit caches: bfloat16 bits [L, NB, bs, K], one per token and KV head
  const uint16_t* v_scales;  // (nullptr for float caches)
};

// Software prefetch of the next page's key and value rows, one token's rows at a time while the
// current page's scores are computed: pages sit at random places in a large pool, so the hardware
// prefetcher cannot run ahead across them.
struct Prefetch {
  const char* keys = nullptr;  // the next page's [bs, K, H] keys and values (nullptr: none)
  const char* values = nullptr;
  int64_t row_bytes = 0;  // K * H * sizeof(T): one token's rows
  void token(int64_t t) const {
    if (!keys) return;
    for (int64_t b = 0; b < row_bytes; b += 64) {
      __builtin_prefetch(keys + t * row_bytes + b);
      __builtin_prefetch(values + t * row_bytes + b);
    }
  }
};

// exp(x) for the softmax, written so that `omp simd` loops vectorize it (glibc's expf is a call
// per element: it was most of this kernel's time). exp(x) = 2^n * e^r with n = round(x log2 e) and
// r = x - n ln 2, |r| <= ln2 / 2; e^r by its Taylor polynomial to degree 7 (truncation < 3e-9
// relative). x is clamped to -87 (exp(-87) ~ 1.6e-38): here x = score - running max <= 0.
// The constants both exps share (fast_exp here, exp16 for the tiled loops): log2(e), ln 2 in two
// parts (Cody-Waite), and e^r's Taylor coefficients from degree 7 down to 0.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723e-6f,
                kExpMin = -87.f;
constexpr float kExpTaylor[8] = {1.f / 5040, 1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};

inline float fast_exp(float x) {
  x = std::max(x, kExpMin);
  const float n = std::nearbyint(x * kLog2e);
  const float r = std::fma(n, -kLn2Hi, x) - n * kLn2Lo;
  float y = kExpTaylor[0];
  for (int i = 1; i < 8; ++i) y = std::fma(y, r, kExpTaylor[i]);
  const int32_t bits = (int32_t(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return y * two_n;
}

// Calls body(t, i, row, scale) for each token t in [t0, t1) and query head i = kh * G + g, with
// the token's key or value row of KV head kh and its scale (1 for float caches).
template <typename T, typename Body>
void each_token_head(const T* rows, const uint16_t* scales, const Shape& s, int64_t t0, int64_t t1, Body body) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t kh = 0; kh < s.K; ++kh) {
      const T* row = rows + (t * s.K + kh) * s.H;
      const float scale = scales ? to_float(scales[t * s.K + kh]) : 1.f;
      for (int64_t g = 0; g < s.G; ++g) body(t, kh * s.G + g, row, scale);
    }
  }
}

// A page's scores, p[i * bs + t] = q_i . k_t (times the key's scale), for every head i = kh * G + g.
template <typename T>
void page_scores(const float* q, const T* keys, const uint16_t* k_scale, const Shape& s, int64_t t0, int64_t t1,
                 float* p) {
  const int64_t H = s.H;
  each_token_head(keys, k_scale, s, t0, t1, [&](int64_t t, int64_t i, const T* key, float scale) {
    const float* qh = q + i * H;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t h = 0; h < H; ++h) dot += qh[h] * to_float(key[h]);
    p[i * s.bs + t] = dot * scale;
  });
}

// acc_i += sum_t p[i * bs + t] * v_t (times the value's scale), for every head i = kh * G + g.
template <typename T>
void page_values(const float* p, const T* values, const uint16_t* v_scale, const Shape& s, int64_t t0,
                 int64_t t1, float* acc) {
  const int64_t H = s.H;
  each_token_head(values, v_scale, s, t0, t1, [&](int64_t t, int64_t i, const T* value, float scale) {
    const float e = p[i * s.bs + t] * scale;
    float* a = acc + i * H;
#pragma omp simd
    for (int64_t h = 0; h < H; ++h) a[h] += e * to_float(value[h]);
  });
}

#ifdef __AVX512F__
// 16 cache elements as float32 lanes.
inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const uint16_t* x) {  // bfloat16 bits: shift into the high half
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline __m512 load16(const int8_t* x) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
}
inline __m512 load16(const Fp8E4M3* x) {  // through the 256-entry table
  const __m512i index = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  return _mm512_i32gather_ps(index, kFp8.value, 4);
}

// exp of 16 lanes (x <= 0 here): the same range reduction and polynomial as `fast_exp`.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpMin));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  __m512 y = _mm512_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 8; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExpTaylor[i]));
  return _mm512_scalef_ps(y, n);
}

// One online-softmax step (FlashAttention's running max and sum) over 16 scores, lanes outside
// `live` masked: updates m and l, sets `rescale` (the factor for the old accumulator, 0 when there
// was none) and returns the probabilities exp(s - m) (0 outside `live`).
inline __m512 online_softmax16(__m512 s, __mmask16 live, float& m, float& l, float& rescale) {
  const __m512 masked = _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), live, s);
  const float m_new = std::max(m, _mm512_reduce_max_ps(masked));
  const __m512 p = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(masked, _mm512_set1_ps(m_new))));
  rescale = std::isinf(m) ? 0.f : fast_exp(m - m_new);
  l = l * rescale + _mm512_reduce_add_ps(p);
  m = m_new;
  return p;
}

// The same two loops with the head dim fixed at 16 * HV: each key or value row is loaded (and
// converted) once into registers, and each head's accumulator stays in registers over the page.
template <typename T, int HV>
void page_scores_avx512(const float* q, const T* keys, const uint16_t* k_scale, const Shape& s, int64_t t0,
                        int64_t t1, float* p, const Prefetch& next) {
  const int64_t K = s.K, G = s.G;
  for (int64_t t = t0; t < t1; ++t) {
    next.token(t);
    for (int64_t kh = 0; kh < K; ++kh) {
      const T* key = keys + (t * K + kh) * 16 * HV;
      __m512 k[HV];
      for (int j = 0; j < HV; ++j) k[j] = load16(key + 16 * j);
      const float scale = k_scale ? to_float(k_scale[t * K + kh]) : 1.f;
      for (int64_t g = 0; g < G; ++g) {
        const float* qh = q + (kh * G + g) * 16 * HV;
        __m512 dot = _mm512_mul_ps(_mm512_loadu_ps(qh), k[0]);
        for (int j = 1; j < HV; ++j) dot = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * j), k[j], dot);
        p[(kh * G + g) * s.bs + t] = _mm512_reduce_add_ps(dot) * scale;
      }
    }
  }
}

// With G fixed (<= 4 query heads per KV head, head dim 64): each value row is loaded and
// converted once for all G heads, whose accumulators stay in registers over the page.
template <typename T, int G>
void page_values_group(const float* p, const T* values, const uint16_t* v_scale, const Shape& s, int64_t t0,
                       int64_t t1, float* acc) {
  constexpr int HV = 4;
  const int64_t K = s.K;
  for (int64_t kh = 0; kh < K; ++kh) {
    __m512 a[G][HV];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < HV; ++j) a[g][j] = _mm512_loadu_ps(acc + ((kh * G + g) * HV + j) * 16);
    for (int64_t t = t0; t < t1; ++t) {
      const T* value = values + (t * K + kh) * 16 * HV;
      __m512 v[HV];
      const float scale = v_scale ? to_float(v_scale[t * K + kh]) : 1.f;
      for (int j = 0; j < HV; ++j) v[j] = load16(value + 16 * j);
      for (int g = 0; g < G; ++g) {
        const __m512 e = _mm512_set1_ps(p[(kh * G + g) * s.bs + t] * scale);
        for (int j = 0; j < HV; ++j) a[g][j] = _mm512_fmadd_ps(e, v[j], a[g][j]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < HV; ++j) _mm512_storeu_ps(acc + ((kh * G + g) * HV + j) * 16, a[g][j]);
  }
}

template <typename T, int HV>
void page_values_avx512(const float* p, const T* values, const uint16_t* v_scale, const Shape& s, int64_t t0,
                        int64_t t1, float* acc) {
  const int64_t K = s.K, G = s.G;
  if constexpr (HV == 4) {
    if (G == 2) return page_values_group<T, 2>(p, values, v_scale, s, t0, t1, acc);
    if (G == 3) return page_values_group<T, 3>(p, values, v_scale, s, t0, t1, acc);
    if (G == 4) return page_values_group<T, 4>(p, values, v_scale, s, t0, t1, acc);
  }
  for (int64_t kh = 0; kh < K; ++kh) {
    for (int64_t g = 0; g < G; ++g) {
      float* out = acc + (kh * G + g) * 16 * HV;
      const float* pi = p + (kh * G + g) * s.bs;
      __m512 a[HV];
      for (int j = 0; j < HV; ++j) a[j] = _mm512_loadu_ps(out + 16 * j);
      for (int64_t t = t0; t < t1; ++t) {
        const T* value = values + (t * K + kh) * 16 * HV;
        const __m512 e = _mm512_set1_ps(pi[t] * (v_scale ? to_float(v_scale[t * K + kh]) : 1.f));
        for (int j = 0; j < HV; ++j) a[j] = _mm512_fmadd_ps(e, load16(value + 16 * j), a[j]);
      }
      for (int j = 0; j < HV; ++j) _mm512_storeu_ps(out + 16 * j, a[j]);
    }
  }
}

template <typename T, int HV>
bool page_avx512(bool scores, const float* x, const T* cache, const uint16_t* scale, const Shape& s, int64_t t0,
                 int64_t t1, float* out, const Prefetch& next) {
  if (s.H != 16 * HV) return false;
  if (scores)
    page_scores_avx512<T, HV>(x, cache, scale, s, t0, t1, out, next);
  else
    page_values_avx512<T, HV>(x, cache, scale, s, t0, t1, out);
  return true;
}
#endif

// The page's scores (scores = true: x = q, out = p) or value sums (x = p, out = acc), with the
// AVX-512 loops for head dims 64, 128 and 256 where the CPU has them.
template <typename T>
void page_pass(bool scores, const float* x, const T* cache, const uint16_t* scale, const Shape& s, int64_t t0,
               int64_t t1, float* out, const Prefetch& next) {
#ifdef __AVX512F__
  if (page_avx512<T, 4>(scores, x, cache, scale, s, t0, t1, out, next) ||
      page_avx512<T, 8>(scores, x, cache, scale, s, t0, t1, out, next) ||
      page_avx512<T, 16>(scores, x, cache, scale, s, t0, t1, out, next))
    return;
#endif
  if (scores)
    page_scores<T>(x, cache, scale, s, t0, t1, out);
  else
    page_values<T>(x, cache, scale, s, t0, t1, out);
}

// Online-softmax update of head i with its page scores pi[t0, t1): the running max, the rescale of
// the running sum and accumulator, and pi turned into exp(score - max).
inline void softmax_update(float* pi, int64_t t0, int64_t t1, int64_t H, float& m, float& l, float* acc) {
#ifdef __AVX512F__
  if (t1 <= 16) {  // a 16-token page (or a smaller block size): its scores as one vector
    const __mmask16 live = __mmask16(((1u << t1) - 1) & ~((1u << t0) - 1));
    float rescale;
    _mm512_mask_storeu_ps(pi, live, online_softmax16(_mm512_maskz_loadu_ps(live, pi), live, m, l, rescale));
#pragma omp simd
    for (int64_t h = 0; h < H; ++h) acc[h] *= rescale;
    return;
  }
#endif
  float m_new = m;
#pragma omp simd reduction(max : m_new)
  for (int64_t t = t0; t < t1; ++t) m_new = std::max(m_new, pi[t]);
  const float rescale = std::isinf(m) ? 0.f : std::exp(m - m_new);
#pragma omp simd
  for (int64_t h = 0; h < H; ++h) acc[h] *= rescale;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = t0; t < t1; ++t) {
    const float e = fast_exp(pi[t] - m_new);
    pi[t] = e;
    sum += e;
  }
  l = l * rescale + sum;
  m = m_new;
}

// One row, all its heads: an online softmax over the row's cached context, one page at a time,
// each page's keys then values read front to back once (a page is [bs, K, H], contiguous).
template <typename T>
void attend_row(int64_t r, const Shape& s, const Inputs& in) {
  const int64_t K = s.K, G = s.G, H = s.H, bs = s.bs, N = K * G;
  const int64_t n = in.ctx[r];
  const float* q = in.q + r * N * H;  // [K, G, H] = [N, H]
  static thread_local float m[kMaxHeads], l[kMaxHeads], acc[kMaxHeads * kMaxHeadDim], p[kMaxHeads * kMaxBlockSize];
  std::fill(m, m + N, -std::numeric_limits<float>::infinity());
  std::fill(l, l + N, 0.f);
  std::fill(acc, acc + N * H, 0.f);
  const int64_t lo = in.window > 0 ? std::max<int64_t>(0, int64_t(in.q_pos[r]) - in.window + 1) : 0;
  const int64_t page_elems = bs * K * H;
  const T* k_cache = static_cast<const T*>(in.k);
  const T* v_cache = static_cast<const T*>(in.v);
  const int64_t first = lo / bs, end = (n + bs - 1) / bs;
  for (int64_t page = first; page < end; ++page) {
    const int64_t base = (in.layer * s.NB + in.tables[r * s.W + page]) * page_elems;
    const int64_t t0 = std::max<int64_t>(lo - page * bs, 0), t1 = std::min<int64_t>(bs, n - page * bs);
    Prefetch next;
    if (page + 1 < end) {
      const int64_t next_base = (in.layer * s.NB + in.tables[r * s.W + page + 1]) * page_elems;
      next = Prefetch{reinterpret_cast<const char*>(k_cache + next_base),
                      reinterpret_cast<const char*>(v_cache + next_base), int64_t(K * H * sizeof(T))};
    }
    page_pass<T>(true, q, k_cache + base, in.k_scales ? in.k_scales + base / H : nullptr, s, t0, t1, p, next);
    for (int64_t i = 0; i < N; ++i) softmax_update(p + i * bs, t0, t1, H, m[i], l[i], acc + i * H);
    page_pass<T>(false, p, v_cache + base, in.v_scales ? in.v_scales + base / H : nullptr, s, t0, t1, acc, next);
  }
  std::copy(m, m + N, in.m + r * N);
  std::copy(l, l + N, in.l + r * N);
  std::copy(acc, acc + N * H, in.acc + r * N * H);
}


// ---- Prefill rows: runs of consecutive queries of one sequence, 16 keys by many queries at a time.

constexpr int64_t kMaxRun = 16;     // queries of one run (one work item)
constexpr int64_t kMaxAmxRun = 64;  // the same on AMX (`attend_run_amx`)
constexpr int kChains = 12;      // (query, head) score vectors computed together per key page

// Whether query b may share query a's pass over the pages: b is the next position (b sees one
// more key) and the same block ids cover b's context, as for consecutive tokens of one prompt
// chunk. Tokens of different sequences never pass (their tables differ).
inline bool same_pages(const Shape& s, const Inputs& in, int64_t a, int64_t b) {
  if (in.ctx[a] <= 0 || in.ctx[b] != in.ctx[a] + 1 || in.q_pos[b] != in.q_pos[a] + 1) return false;
  const int64_t pages = (in.ctx[b] + s.bs - 1) / s.bs;
  return std::equal(in.tables + a * s.W, in.tables + a * s.W + pages, in.tables + b * s.W);
}

// Work items: runs of up to max_run consecutive rows that pass `same_pages` (a decode row is a
// run of one); starts[i], starts[i + 1] bound run i. Returns the number of runs.
inline int64_t plan_runs(const Shape& s, const Inputs& in, int64_t max_run, int64_t* starts) {
  int64_t count = 0;
  for (int64_t r = 0; r < s.R; ++r)
    if (r == 0 || r - starts[count - 1] >= max_run || !same_pages(s, in, r - 1, r)) starts[count++] = r;
  starts[count] = s.R;
  return count;
}

#ifdef __AVX512F__
// A run's state: per (query, head) the running max, sum and weighted values, and the page's
// keys transposed ([K, H, 16]: 16 keys in one vector per head dim) and values widened ([16, K, H]).
struct RunState {
  float m[kMaxRun * kMaxHeads], l[kMaxRun * kMaxHeads];
  float acc[kMaxRun * kMaxHeads * kMaxHeadDim] __attribute__((aligned(64)));
  float keys_t[kMaxHeads * kMaxHeadDim * 16] __attribute__((aligned(64)));
  float values[16 * kMaxHeads * kMaxHeadDim] __attribute__((aligned(64)));
  float zero_q[kMaxHeadDim];  // the query of an unused chain
};

// The page's rows [a, b) into st (keys transposed, values widened); the other rows' values are
// zeroed, so that a masked score (probability 0) never meets a stale value.
template <typename T>
void load_page(const T* keys, const T* values, int64_t K, int64_t H, int64_t a, int64_t b, RunState& st) {
  const int64_t row = K * H;
  for (int64_t t = 0; t < 16; ++t) {
    float* v = st.values + t * row;
    if (t < a || t >= b) {
      std::fill(v, v + row, 0.f);
      continue;
    }
    for (int64_t e = 0; e < row; e += 16) _mm512_store_ps(v + e, load16(values + t * row + e));
    for (int64_t e = 0; e < row; ++e) st.keys_t[e * 16 + t] = to_float(keys[t * row + e]);
  }
}

// Scores of kChains (query, head) pairs against the page's 16 keys of KV head kh: s[c] =
// q_c . k_t over lanes t, the keys' vector per head dim shared by every chain.
template <int HV>
inline void chain_scores(const float* const* q, const float* keys_t, __m512* s) {
  for (int c = 0; c < kChains; ++c) s[c] = _mm512_setzero_ps();
  for (int h = 0; h < 16 * HV; ++h) {
    const __m512 k = _mm512_load_ps(keys_t + h * 16);
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) s[c] = _mm512_fmadd_ps(_mm512_set1_ps(q[c][h]), k, s[c]);
  }
}

// One (query, head) pair's online-softmax step over the page's 16 scores (lanes outside `live`
// masked), then its weighted values: acc += sum_t p_t * v_t of KV head kh.
template <int HV>
inline void chain_update(__m512 s, __mmask16 live, float& m, float& l, float* acc, const float* values,
                         int64_t row, int64_t kh) {
  float rescale;
  const __m512 p = online_softmax16(s, live, m, l, rescale);
  alignas(64) float pt[16];
  _mm512_store_ps(pt, p);
  __m512 a[HV];
  for (int j = 0; j < HV; ++j) a[j] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * j), _mm512_set1_ps(rescale));
  for (int t = 0; t < 16; ++t) {
    const __m512 w = _mm512_set1_ps(pt[t]);
    const float* v = values + t * row + kh * 16 * HV;
    for (int j = 0; j < HV; ++j) a[j] = _mm512_fmadd_ps(w, _mm512_load_ps(v + 16 * j), a[j]);
  }
  for (int j = 0; j < HV; ++j) _mm512_storeu_ps(acc + 16 * j, a[j]);
}

// Rows [r0, r1) of one run (a prefill chunk's consecutive queries), 16-token pages of float or
// bfloat16 caches: each page is read and widened once for the whole run; scores are computed as
// 16 keys by kChains (query, head) pairs with no horizontal sums (FlashAttention's tiling, Dao et
// al. 2022, on CPU vectors), and each pair's online softmax is updated per page.
template <typename T, int HV>
void attend_tile(int64_t r0, int64_t r1, const Shape& s, const Inputs& in) {
  constexpr int64_t H = 16 * HV;
  const int64_t K = s.K, G = s.G, N = K * G, n = r1 - r0, row = K * H;
  static thread_local RunState st;
  std::fill(st.m, st.m + n * N, -std::numeric_limits<float>::infinity());
  std::fill(st.l, st.l + n * N, 0.f);
  std::fill(st.acc, st.acc + n * N * H, 0.f);
  std::fill(st.zero_q, st.zero_q + H, 0.f);
  auto lo = [&](int64_t r) { return in.window > 0 ? std::max<int64_t>(0, int64_t(in.q_pos[r]) - in.window + 1) : int64_t(0); };
  const T* k_cache = static_cast<const T*>(in.k);
  const T* v_cache = static_cast<const T*>(in.v);
  const int32_t* table = in.tables + r0 * s.W;
  const int64_t first = lo(r0) / 16, end = (in.ctx[r1 - 1] + 15) / 16;
  for (int64_t page = first; page < end; ++page) {
    const int64_t base = (in.layer * s.NB + table[page]) * 16 * row;
    const int64_t a = std::max<int64_t>(lo(r0) - page * 16, 0), b = std::min<int64_t>(16, in.ctx[r1 - 1] - page * 16);
    load_page<T>(k_cache + base, v_cache + base, K, H, a, b, st);
    for (int64_t kh = 0; kh < K; ++kh) {
      for (int64_t c0 = 0; c0 < n * G; c0 += kChains) {  // chain c = (query c / G, head kh * G + c % G)
        const float* q[kChains];
        for (int c = 0; c < kChains; ++c) {
          const int64_t j = (c0 + c) / G, g = (c0 + c) % G;
          q[c] = c0 + c < n * G ? in.q + ((r0 + j) * N + kh * G + g) * H : st.zero_q;
        }
        __m512 sc[kChains];
        chain_scores<HV>(q, st.keys_t + kh * H * 16, sc);
        for (int c = 0; c < kChains && c0 + c < n * G; ++c) {
          const int64_t j = (c0 + c) / G, i = kh * G + (c0 + c) % G, r = r0 + j;
          const int64_t t0 = std::max<int64_t>(lo(r) - page * 16, 0), t1 = std::min<int64_t>(16, in.ctx[r] - page * 16);
          if (t0 >= t1) continue;
          const __mmask16 live = __mmask16(((1u << t1) - 1) & ~((1u << t0) - 1));
          chain_update<HV>(sc[c], live, st.m[j * N + i], st.l[j * N + i], st.acc + (j * N + i) * H, st.values, row, kh);
        }
      }
    }
  }
  std::copy(st.m, st.m + n * N, in.m + r0 * N);
  std::copy(st.l, st.l + n * N, in.l + r0 * N);
  std::copy(st.acc, st.acc + n * N * H, in.acc + r0 * N * H);
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
// ---- Prefill runs on Intel AMX (bfloat16 pages of 16 tokens, head dim a multiple of 32).
//
// The same run as `attend_tile` (consecutive queries of one sequence, up to kMaxAmxRun), with both
// products on AMX's tile unit: per block of two pages (32 keys) and query head, the scores
// S = Q K^T (16 queries x 32 keys, float32 sums of bfloat16 products), an online-softmax step
// per query over its 32 scores (AVX-512), then P V with P rounded to bfloat16
// (FlashAttention-2's blocked loop, Dao 2023; bfloat16 operands with float32 accumulation, as
// its GPU kernels). Q is rounded to bfloat16 once per run. Each block's keys are laid out once
// per KV head as the B operand of S (pairs of head dims per key) and its values as the B
// operand of P V (pairs of keys per head dim): Intel's pair-interleaved layout for TDPBF16PS.
// Tiles (all 16 rows x 64 bytes): `amx_block_step` says which holds what.

// Whether this process may use AMX tiles: Linux (>= 5.16) grants the tile state per process
// on request (arch_prctl ARCH_REQ_XCOMP_PERM, feature 18: XTILEDATA); asked once.
bool amx_tiles_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
  return granted;
}

// The AMX loop is used unless JAXINFER_NATIVE_AMX=0 (the switch of the AMX products too,
// jaxinfer/native_amx.py), read per call so that a process can compare both loops.
bool amx_attention_on() {
  const char* env = std::getenv("JAXINFER_NATIVE_AMX");
  return !(env && env[0] == '0' && env[1] == '\0') && amx_tiles_granted();
}

struct AmxTileConfig {  // the 64-byte operand of LDTILECFG (palette 1)
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// A run's state: Q in bfloat16 ([N heads][kMaxAmxRun queries][H]), the block's keys and values
// in the B layouts of one KV head, S, P and P V of one head and 16 queries, and per (query, head)
// the running max, sum and weighted values (acc [queries][N][H], as attend_tile's).
struct AmxRunState {
  uint16_t q[kMaxHeads * kMaxAmxRun * kMaxHeadDim] __attribute__((aligned(64)));
  uint32_t keys[kMaxHeadDim / 32 * 2 * 16 * 16] __attribute__((aligned(64)));  // [H/32][half][pair][key]
  uint16_t values[kMaxHeadDim / 16 * 16 * 32] __attribute__((aligned(64)));    // [H/16][key pair][dim][2]
  float s[2 * 16 * 16] __attribute__((aligned(64)));                              // [half][query][key]
  uint16_t p[16 * 32] __attribute__((aligned(64)));                               // [query][key]
  float pv[16 * kMaxHeadDim] __attribute__((aligned(64)));                        // [query][H]
  float m[kMaxAmxRun * kMaxHeads], l[kMaxAmxRun * kMaxHeads];
  float acc[kMaxAmxRun * kMaxHeads * kMaxHeadDim] __attribute__((aligned(64)));
};

// Block keys [0, 32) of KV head kh as the B operands: st.keys[c][t / 16][p][t % 16] = the pair of
// dims (32c + 2p, 32c + 2p + 1) of key t (one scatter per key and 32 dims), and
// st.values[d][t / 2][e][t % 2] = dim 16d + e of value t (two values' 16 dims interleaved by one
// permute). `pages[h]` is half h's page (nullptr: none); keys outside [a, b) are zeros, so that no
// stale row reaches a product.
void amx_block_operands(const uint16_t* const* pages, const uint16_t* const* value_pages, int64_t K, int64_t H,
                        int64_t kh, int64_t a, int64_t b, AmxRunState& st) {
  const int64_t row = K * H;
  auto key_row = [&](const uint16_t* const* src, int64_t t) -> const uint16_t* {
    return src[t / 16] && t >= a && t < b ? src[t / 16] + (t % 16) * row + kh * H : nullptr;
  };
  const __m512i down = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(16));
  for (int64_t t = 0; t < 32; ++t) {
    const uint16_t* key = key_row(pages, t);
    for (int64_t c = 0; c < H / 32; ++c) {
      const __m512i pairs = key ? _mm512_loadu_si512(key + 32 * c) : _mm512_setzero_si512();
      _mm512_i32scatter_epi32(st.keys + ((c * 2 + t / 16) * 16) * 16 + t % 16, down, pairs, 4);
    }
  }
  const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t t = 0; t < 32; t += 2) {
    const uint16_t* v0 = key_row(value_pages, t);
    const uint16_t* v1 = key_row(value_pages, t + 1);
    for (int64_t d = 0; d < H / 16; ++d) {
      const __m256i x0 = v0 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v0 + 16 * d)) : _mm256_setzero_si256();
      const __m256i x1 = v1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v1 + 16 * d)) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1);
      _mm512_store_si512(st.values + (d * 16 + t / 2) * 32, _mm512_permutexvar_epi16(zip, both));
    }
  }
}

// One (query, head) step over a block's 32 scores s0 | s1 (lanes outside live0 | live1 masked):
// the running max and sum updated, P's row written (bfloat16), and the factor for the old
// accumulator returned (0 when there was none).
inline float amx_softmax_row(__m512 s0, __m512 s1, __mmask16 live0, __mmask16 live1, float& m, float& l,
                             uint16_t* p_row) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 a = _mm512_mask_mov_ps(ninf, live0, s0), b = _mm512_mask_mov_ps(ninf, live1, s1);
  const float m_new = std::max(m, _mm512_reduce_max_ps(_mm512_max_ps(a, b)));
  const __m512 shift = _mm512_set1_ps(m_new);
  const __m512 p0 = _mm512_maskz_mov_ps(live0, exp16(_mm512_sub_ps(a, shift)));
  const __m512 p1 = _mm512_maskz_mov_ps(live1, exp16(_mm512_sub_ps(b, shift)));
  const float rescale = std::isinf(m) ? 0.f : fast_exp(m - m_new);
  l = l * rescale + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
  m = m_new;
  _mm512_store_si512(p_row, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
  return rescale;
}

// One block of 32 keys for query head i and the run's queries [q0, q0 + nq) (nq <= 16), the
// block's operands in st: S = Q K^T on tiles 0, 6 (the 32-dim slices of Q and K alternate between
// tiles 1, 2, 7 and 3, 4, 5, so that a slice's loads need not wait for the previous slice's
// products), the online-softmax step per query, then P V for 64 head dims at a time on tiles 0,
// 5, 6, 7 (V's slices in 1, 2, 4, then 1 again), and the accumulators rescaled and summed.
template <int64_t H>
inline void amx_block_step(int64_t i, int64_t q0, int64_t nq, const uint32_t* live, int64_t N, AmxRunState& st) {
  const uint16_t* q = st.q + (i * kMaxAmxRun + q0) * H;
  _tile_zero(0);
  _tile_zero(6);
  for (int64_t c = 0; c < H / 32; c += 2) {
    _tile_loadd(1, q + 32 * c, H * 2);
    _tile_loadd(2, st.keys + (c * 2) * 256, 64);
    _tile_loadd(7, st.keys + (c * 2 + 1) * 256, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_dpbf16ps(6, 1, 7);
    _tile_loadd(3, q + 32 * (c + 1), H * 2);
    _tile_loadd(4, st.keys + (c * 2 + 2) * 256, 64);
    _tile_loadd(5, st.keys + (c * 2 + 3) * 256, 64);
    _tile_dpbf16ps(0, 3, 4);
    _tile_dpbf16ps(6, 3, 5);
  }
  _tile_stored(0, st.s, 64);
  _tile_stored(6, st.s + 256, 64);
  float rescale[16];
  for (int64_t j = 0; j < nq; ++j) {
    uint16_t* p_row = st.p + j * 32;
    if (!live[j]) {
      std::fill(p_row, p_row + 32, uint16_t(0));
      rescale[j] = 1.f;
      continue;
    }
    const int64_t at = (q0 + j) * N + i;
    rescale[j] = amx_softmax_row(_mm512_load_ps(st.s + j * 16), _mm512_load_ps(st.s + 256 + j * 16),
                                 __mmask16(live[j]), __mmask16(live[j] >> 16), st.m[at], st.l[at], p_row);
  }
  _tile_loadd(3, st.p, 64);
  for (int64_t d = 0; d < H / 16; d += 4) {
    _tile_zero(0);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    _tile_loadd(1, st.values + d * 512, 64);
    _tile_dpbf16ps(0, 3, 1);
    _tile_loadd(2, st.values + (d + 1) * 512, 64);
    _tile_dpbf16ps(5, 3, 2);
    _tile_loadd(4, st.values + (d + 2) * 512, 64);
    _tile_dpbf16ps(6, 3, 4);
    _tile_loadd(1, st.values + (d + 3) * 512, 64);
    _tile_dpbf16ps(7, 3, 1);
    _tile_stored(0, st.pv + 16 * d, H * 4);
    _tile_stored(5, st.pv + 16 * (d + 1), H * 4);
    _tile_stored(6, st.pv + 16 * (d + 2), H * 4);
    _tile_stored(7, st.pv + 16 * (d + 3), H * 4);
  }
  for (int64_t j = 0; j < nq; ++j) {
    if (!live[j]) continue;
    float* acc = st.acc + ((q0 + j) * N + i) * H;
    const __m512 f = _mm512_set1_ps(rescale[j]);
    for (int64_t h = 0; h < H; h += 16)
      _mm512_storeu_ps(acc + h, _mm512_fmadd_ps(_mm512_loadu_ps(acc + h), f, _mm512_load_ps(st.pv + j * H + h)));
  }
}
// Rows [r0, r1) of one run on AMX (see above), 16 queries at a time: each block's operands are
// laid out once per KV head for all of the run's queries; a group of 16 with no key in the block
// skips it. The caller saved and restores the tile config.
template <int64_t H>
void attend_tile_amx(int64_t r0, int64_t r1, const Shape& s, const Inputs& in) {
  const int64_t K = s.K, G = s.G, N = K * G, n = r1 - r0, row = K * H, groups = (n + 15) / 16;
  static thread_local AmxRunState st;
  std::fill(st.m, st.m + n * N, -std::numeric_limits<float>::infinity());
  std::fill(st.l, st.l + n * N, 0.f);
  std::fill(st.acc, st.acc + n * N * H, 0.f);
  for (int64_t i = 0; i < N; ++i)  // Q rounded to bfloat16, rows past n (to the group's 16) zero
    for (int64_t j = 0; j < groups * 16; ++j)
      for (int64_t h = 0; h < H; h += 16) {
        const __m512 x = j < n ? _mm512_loadu_ps(in.q + ((r0 + j) * N + i) * H + h) : _mm512_setzero_ps();
        _mm256_store_si256(reinterpret_cast<__m256i*>(st.q + (i * kMaxAmxRun + j) * H + h),
                           (__m256i)_mm512_cvtneps_pbh(x));
      }
  std::fill(st.p, st.p + 16 * 32, uint16_t(0));
  auto lo = [&](int64_t r) { return in.window > 0 ? std::max<int64_t>(0, int64_t(in.q_pos[r]) - in.window + 1) : int64_t(0); };
  const uint16_t* k_cache = static_cast<const uint16_t*>(in.k);
  const uint16_t* v_cache = static_cast<const uint16_t*>(in.v);
  const int32_t* table = in.tables + r0 * s.W;
  const int64_t first = lo(r0) / 16, end = (in.ctx[r1 - 1] + 15) / 16;
  uint32_t live[kMaxAmxRun];  // per query: its keys of this block, bits [t0, t1)
  for (int64_t page = first; page < end; page += 2) {
    const int64_t key0 = page * 16;  // position of the block's first key
    const uint16_t* kp[2] = {nullptr, nullptr};
    const uint16_t* vp[2] = {nullptr, nullptr};
    for (int64_t h = 0; h < 2 && page + h < end; ++h) {
      const int64_t base = (in.layer * s.NB + table[page + h]) * 16 * row;
      kp[h] = k_cache + base;
      vp[h] = v_cache + base;
    }
    const int64_t a = std::max<int64_t>(lo(r0) - key0, 0), b = std::min<int64_t>(32, in.ctx[r1 - 1] - key0);
    bool group_live[kMaxAmxRun / 16] = {};
    for (int64_t j = 0; j < groups * 16; ++j) {
      const int64_t t0 = j < n ? std::clamp<int64_t>(lo(r0 + j) - key0, 0, 32) : 32;
      const int64_t t1 = j < n ? std::clamp<int64_t>(in.ctx[r0 + j] - key0, 0, 32) : 0;
      live[j] = t0 >= t1 ? 0u : uint32_t((t1 == 32 ? ~0ull : (1ull << t1) - 1) & ~((1ull << t0) - 1));
      group_live[j / 16] |= live[j] != 0;
    }
    for (int64_t kh = 0; kh < K; ++kh) {
      amx_block_operands(kp, vp, K, H, kh, a, b, st);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t u = 0; u < groups; ++u)
          if (group_live[u]) amx_block_step<H>(kh * G + g, u * 16, std::min<int64_t>(16, n - u * 16), live + u * 16, N, st);
    }
  }
  std::copy(st.m, st.m + n * N, in.m + r0 * N);
  std::copy(st.l, st.l + n * N, in.l + r0 * N);
  std::copy(st.acc, st.acc + n * N * H, in.acc + r0 * N * H);
}

// Whether a run of rows goes to `attend_run_amx` (bfloat16 pages of 16 tokens without scales, head
// dim 64, 128 or 256, AMX on); `run_items` plans runs of up to kMaxAmxRun queries then.
bool amx_applies(const Shape& s, const Inputs& in) {
  return s.bs == 16 && !in.k_scales && (s.H == 64 || s.H == 128 || s.H == 256) && amx_attention_on();
}

// A run on AMX (`amx_applies` held); the thread's tile configuration is saved and restored,
// since XLA's own AMX kernels share it.
void attend_run_amx(int64_t r0, int64_t r1, const Shape& s, const Inputs& in) {
  alignas(64) uint8_t saved[64];
  _tile_storeconfig(saved);
  AmxTileConfig ours;
  for (int t = 0; t < 8; ++t) {
    ours.rows[t] = 16;
    ours.colsb[t] = 64;
  }
  _tile_loadconfig(&ours);
  if (s.H == 64) attend_tile_amx<64>(r0, r1, s, in);
  else if (s.H == 128) attend_tile_amx<128>(r0, r1, s, in);
  else attend_tile_amx<256>(r0, r1, s, in);
  if (saved[0] == 0)
    _tile_release();
  else
    _tile_loadconfig(saved);
}
#else
bool amx_applies(const Shape&, const Inputs&) { return false; }
void attend_run_amx(int64_t, int64_t, const Shape&, const Inputs&) {}
#endif

// The tiled loops for a run of several queries, where they apply (float or bfloat16 pages of 16
// tokens, head dim 64, 128 or 256, no scales); false: the caller runs the rows one at a time.
template <typename T>
bool attend_run_tiled(int64_t r0, int64_t r1, const Shape& s, const Inputs& in) {
  if (r1 - r0 < 2 || s.bs != 16 || in.k_scales || !(std::is_same<T, float>::value || std::is_same<T, uint16_t>::value))
    return false;
  if (s.H == 64) attend_tile<T, 4>(r0, r1, s, in);
  else if (s.H == 128) attend_tile<T, 8>(r0, r1, s, in);
  else if (s.H == 256) attend_tile<T, 16>(r0, r1, s, in);
  else return false;
  return true;
}
#else
template <typename T>
bool attend_run_tiled(int64_t, int64_t, const Shape&, const Inputs&) { return false; }
bool amx_applies(const Shape&, const Inputs&) { return false; }
void attend_run_amx(int64_t, int64_t, const Shape&, const Inputs&) {}
#endif

// One work item per run of rows (`plan_runs`: a decode row alone, a prefill chunk's queries up
// to kMaxRun together, kMaxAmxRun on AMX), over XLA's intra-op pool (parallel_items.h). Items
// are taken last run first: a chunk's last queries see the most keys, and starting the longest
// items first lets the threads finish together.
template <typename T>
void run_items(ffi::ThreadPool& pool, const Shape& s, const Inputs& in) {
  auto starts = std::make_shared<std::vector<int64_t>>(s.R + 1);
  const bool amx = std::is_same<T, uint16_t>::value && amx_applies(s, in);
  const int64_t runs = plan_runs(s, in, amx ? kMaxAmxRun : kMaxRun, starts->data());
  jaxinfer::parallel_items(pool, runs, [s, in, starts, runs, amx](int64_t item) {
    const int64_t i = runs - 1 - item;
    const int64_t r0 = (*starts)[i], r1 = (*starts)[i + 1];
    if (amx && r1 - r0 >= 2)
      attend_run_amx(r0, r1, s, in);
    else if (!attend_run_tiled<T>(r0, r1, s, in))
      for (int64_t r = r0; r < r1; ++r) attend_row<T>(r, s, in);
  });
}

ffi::Error check(const ffi::Buffer<ffi::F32>& q, const ffi::AnyBuffer& k_cache, const ffi::AnyBuffer& v_cache,
                 const ffi::Buffer<ffi::S32>& tables, Shape* s) {
  const auto qd = q.dimensions(), cd = k_cache.dimensions();
  if (qd.size() != 4 || cd.size() != 5 || tables.dimensions().size() != 2)
    return ffi::Error::InvalidArgument("paged_decode: q [R,K,G,H], caches [L,NB,bs,K,H], tables [R,W] expected");
  *s = Shape{qd[0], qd[1], qd[2], qd[3], cd[1], cd[2], tables.dimensions()[1]};
  if (s->K * s->G > kMaxHeads || s->H > kMaxHeadDim || s->bs > kMaxBlockSize || cd[3] != s->K || cd[4] != s->H)
    return ffi::Error::InvalidArgument("paged_decode: shapes disagree or exceed the kernel's limits");
  if (k_cache.element_type() != v_cache.element_type())
    return ffi::Error::InvalidArgument("paged_decode: k and v caches differ in dtype");
  return ffi::Error::Success();
}

// Both targets: check the shapes, then run the rows with the cache's element type. Float caches
// come without scales; 8-bit caches (jaxinfer/kv_quant.py) with theirs.
ffi::Error decode(ffi::ThreadPool& pool, const ffi::Buffer<ffi::F32>& q, const ffi::AnyBuffer& k_cache,
                  const ffi::AnyBuffer& v_cache, const uint16_t* k_scales, const uint16_t* v_scales,
                  const ffi::Buffer<ffi::S32>& layer, const ffi::Buffer<ffi::S32>& tables,
                  const ffi::Buffer<ffi::S32>& ctx, const ffi::Buffer<ffi::S32>& q_pos,
                  const ffi::Buffer<ffi::S32>& window, ffi::ResultBuffer<ffi::F32>& m,
                  ffi::ResultBuffer<ffi::F32>& l, ffi::ResultBuffer<ffi::F32>& acc) {
  Shape s;
  if (ffi::Error error = check(q, k_cache, v_cache, tables, &s); error.failure()) return error;
  const Inputs in{q.typed_data(), k_cache.untyped_data(), v_cache.untyped_data(), layer.typed_data()[0],
                  tables.typed_data(), ctx.typed_data(), q_pos.typed_data(), window.typed_data()[0],
                  m->typed_data(), l->typed_data(), acc->typed_data(), k_scales, v_scales};
  const bool scaled = k_scales != nullptr;
  const auto type = k_cache.element_type();
  if (!scaled && type == ffi::F32) {
    run_items<float>(pool, s, in);
  } else if (!scaled && type == ffi::U16) {
    run_items<uint16_t>(pool, s, in);
  } else if (scaled && type == ffi::S8) {
    run_items<int8_t>(pool, s, in);
  } else if (scaled && type == ffi::F8E4M3FN) {
    run_items<Fp8E4M3>(pool, s, in);
  } else {
    return ffi::Error::InvalidArgument(
        scaled ? "paged_decode: an 8-bit cache must be int8 or float8_e4m3fn"
               : "paged_decode: the cache must be float32 or bfloat16 bits (uint16)");
  }
  return ffi::Error::Success();
}

ffi::Error paged_decode(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k_cache,
                        ffi::AnyBuffer v_cache, ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> tables,
                        ffi::Buffer<ffi::S32> ctx, ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> window,
                        ffi::ResultBuffer<ffi::F32> m, ffi::ResultBuffer<ffi::F32> l,
                        ffi::ResultBuffer<ffi::F32> acc) {
  return decode(pool, q, k_cache, v_cache, nullptr, nullptr, layer, tables, ctx, q_pos, window, m, l, acc);
}

ffi::Error paged_decode_8bit(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k_cache,
                             ffi::AnyBuffer v_cache, ffi::Buffer<ffi::U16> k_scales, ffi::Buffer<ffi::U16> v_scales,
                             ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> tables, ffi::Buffer<ffi::S32> ctx,
                             ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> window, ffi::ResultBuffer<ffi::F32> m,
                             ffi::ResultBuffer<ffi::F32> l, ffi::ResultBuffer<ffi::F32> acc) {
  return decode(pool, q, k_cache, v_cache, k_scales.typed_data(), v_scales.typed_data(), layer, tables, ctx, q_pos,
                window, m, l, acc);
}

// Both targets' bindings: the thread pool, q and the two caches, then (8-bit) the two scale
// arrays, then the same five int32 inputs and three float32 outputs.
auto head_binding() {
  return ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>();
}
template <typename Binding>
auto tail_binding(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::Buffer<ffi::S32>>()  // layer
      .template Arg<ffi::Buffer<ffi::S32>>()  // tables
      .template Arg<ffi::Buffer<ffi::S32>>()  // ctx
      .template Arg<ffi::Buffer<ffi::S32>>()  // q_pos
      .template Arg<ffi::Buffer<ffi::S32>>()  // window
      .template Ret<ffi::Buffer<ffi::F32>>()  // m
      .template Ret<ffi::Buffer<ffi::F32>>()  // l
      .template Ret<ffi::Buffer<ffi::F32>>();  // acc
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferPagedDecode, paged_decode, tail_binding(head_binding()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferPagedDecode8bit, paged_decode_8bit,
                              tail_binding(head_binding().Arg<ffi::Buffer<ffi::U16>>().Arg<ffi::Buffer<ffi::U16>>()));
