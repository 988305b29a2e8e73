// Paged attention on CPU (one query, or a run of a prompt chunk's queries, per work item), as an
// XLA FFI custom call ("jaxinfer_paged_decode"). Built and registered by
// jaxinfer/kernels/cpu/attention.py; called from jaxinfer/layers/attention/xla.py (_native_paged_attention) for
// every token of a step, decode and prefill alike, after the step's K/V were written: a "row"
// below is one query with its own block table and the number of positions it sees (its position
// + 1). Outputs are the (max, sum, weighted values) partial softmax; xla.py divides.
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
// bfloat16): a 512-token prompt's 30 layers, 79 against 200 ms. Two changes since
// (benchmarks/results/2026-12-03-cpu2-prefill-runs/, kernel alone, 512-token chunk, 30 layers):
// runs there hold up to 64 queries (kMaxAmxRun) instead of 16, so that each block is laid out
// for the tiles once per 64 queries, 83.5 -> 66.2 ms; the scores are computed transposed (keys
// read in place as the A operand, a group of 16 queries in a vector's lanes), so that the
// online softmax needs no reduction across lanes, 64.4 -> 51.8 ms. Decode rows stay on AVX-512:
// their scores on AMX (keys as stored as the A operand, the query as B) were no faster, 24.3
// against 19.7 ms for 32 rows at context ~281 (13.8 against 12.8 with the pages in cache).
// On a CPU with AVX-512 BF16 and no AMX (AMD Zen 4 on) the same runs, blocks, layouts and softmax
// go through VDPBF16PS loops instead of the tiles (the second `amx_block_step`): on the 2-core AMD
// EPYC, the kernel alone on a 512-token chunk, 30 layers, 76.5 against 26.9-29.6 ms for the float32
// FMA loop of `attend_tile` (benchmarks/results/2026-12-04-cpu2-int8-kernel/, probes), and a whole
// 512-token prefill 198 against 164 ms.
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

#include "amx_tiles.h"
#include "fast_exp.h"
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

using jaxinfer::fast_exp;  // fast_exp.h: exp for the softmax (x = score - running max <= 0 here)

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

using jaxinfer::exp16;  // fast_exp.h: 16 lanes

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

#if defined(__AVX512BF16__)
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && !defined(JAXINFER_NO_AMX)  // (tests build both)
#define JAXINFER_ATTENTION_AMX 1
#endif
// ---- Prefill runs on Intel AMX (bfloat16 pages of 16 tokens, head dim a multiple of 32), or on
// VDPBF16PS where the CPU has AVX-512 BF16 and no AMX (AMD Zen 4 on): the same blocks, layouts and
// softmax, each product a loop of VDPBF16PS (the second `amx_block_step`) instead of tile instructions.
//
// The same run as `attend_tile` (consecutive queries of one sequence, up to kMaxAmxRun), with both
// products on AMX's tile unit, its queries in groups of 16: per block of two pages (32 keys),
// query head and group, the scores S^T = K Q^T (32 keys x 16 queries, float32 sums of bfloat16
// products), an online-softmax step of the group's queries (AVX-512, a query per lane, a vector
// per key), then (P V)^T = V^T P^T with P rounded to bfloat16 (FlashAttention-2's blocked loop,
// Dao 2023; bfloat16 operands with float32 accumulation, as its GPU kernels). Computed this way
// round, the keys are AMX's A operand as stored (row-major, a key per row, read in place from
// the page), and the softmax's max and sum over keys are sums of vectors, not reductions across
// lanes. Q^T is laid out once per run as the B operand (pairs of head dims per query), each
// block's values once per KV head as V^T (a head dim per row) and P^T per step (pairs of keys per
// query): Intel's pair-interleaved layout for TDPBF16PS.
// Tiles (all 16 rows x 64 bytes): `amx_block_step` says which holds what.

#ifdef JAXINFER_ATTENTION_AMX
// Whether this process may use AMX tiles: Linux (>= 5.16) grants the tile state per process
// on request (arch_prctl ARCH_REQ_XCOMP_PERM, feature 18: XTILEDATA); asked once.
bool amx_tiles_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
  return granted;
}
#endif

// The bfloat16 run loop is used unless JAXINFER_NATIVE_AMX=0 (the switch of the packed products
// too, jaxinfer/kernels/cpu/amx.py), read per call so that a process can compare both loops.
bool amx_attention_on() {
  const char* env = std::getenv("JAXINFER_NATIVE_AMX");
  if (env && env[0] == '0' && env[1] == '\0') return false;
#ifdef JAXINFER_ATTENTION_AMX
  return amx_tiles_granted();
#else
  return true;
#endif
}

// A run's state, for queries taken in groups of 16 (a group's queries are the 16 lanes of a
// vector and the 16 columns of a tile): Q^T of each head and group as the B operand of S^T
// ([N][group][H / 32][dim pair p][query]: dims 2p, 2p + 1 of a 32-dim slice), the block's values
// of one KV head as V^T, the A operand of (P V)^T ([dim][key]), S^T ([key][query]), P^T as the B
// operand of (P V)^T ([key pair][query]: keys 2p, 2p + 1), (P V)^T ([dim][query]), and per
// (head, group) the running max, sum and weighted values with the group's queries in lanes
// (m, l [N][group][16], acc [N][group][H][16]).
constexpr int64_t kAmxGroups = kMaxAmxRun / 16;
struct AmxRunState {
  uint32_t q_t[kMaxHeads * kAmxGroups * (kMaxHeadDim / 32) * 256] __attribute__((aligned(64)));
  uint16_t values_t[kMaxHeadDim * 32] __attribute__((aligned(64)));
  float s[32 * 16] __attribute__((aligned(64)));
  uint32_t p[16 * 16] __attribute__((aligned(64)));
  float pv[kMaxHeadDim * 16] __attribute__((aligned(64)));
  float m[kMaxHeads * kAmxGroups * 16] __attribute__((aligned(64)));
  float l[kMaxHeads * kAmxGroups * 16] __attribute__((aligned(64)));
  float acc[kMaxHeads * kAmxGroups * kMaxHeadDim * 16] __attribute__((aligned(64)));
};

// 16 x 16 lanes: lane e of vector x goes to element e * 16 of a scatter (a column of a 16 x 16
// 32-bit matrix); pairs: the two halves of 32 16-bit lanes interleaved (lane 2e <- e, 2e + 1 <- 16 + e).
inline __m512i column_index() {
  return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
}
inline __m512i pair_index() {
  return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19,
                          3, 18, 2, 17, 1, 16, 0);
}

// Q^T of the run's rows [r0, r1) into st.q_t, rounded to bfloat16 (query columns past the run zero).
template <int64_t H>
void amx_queries(int64_t r0, int64_t n, int64_t N, const float* q, AmxRunState& st) {
  const __m512i down = column_index();
  const int64_t groups = (n + 15) / 16;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t u = 0; u < groups; ++u)
      for (int64_t c = 0; c < H / 32; ++c) {
        uint32_t* tile = st.q_t + ((i * kAmxGroups + u) * (H / 32) + c) * 256;
        for (int64_t j = 0; j < 16; ++j) {
          const int64_t r = u * 16 + j;
          const float* x = q + ((r0 + r) * N + i) * H + 32 * c;
          const __m512i dims = r < n ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x))
                                     : _mm512_setzero_si512();
          _mm512_i32scatter_epi32(tile + j, down, dims, 4);
        }
      }
}

// The block's values [0, 32) of KV head kh as V^T in st.values_t (row e: dim e's 32 values); keys
// outside [a, b) are zeros, so that a masked probability (0) never meets a stale value.
// `pages[h]` is half h's page (nullptr: none).
void amx_block_values(const uint16_t* const* pages, int64_t K, int64_t H, int64_t kh, int64_t a, int64_t b,
                      AmxRunState& st) {
  const int64_t row = K * H;
  auto value_row = [&](int64_t t) -> const uint16_t* {
    return pages[t / 16] && t >= a && t < b ? pages[t / 16] + (t % 16) * row + kh * H : nullptr;
  };
  const __m512i down = column_index(), zip = pair_index();
  uint32_t* out = reinterpret_cast<uint32_t*>(st.values_t);  // [dim][key pair]
  for (int64_t t = 0; t < 32; t += 2) {
    const uint16_t* v0 = value_row(t);
    const uint16_t* v1 = value_row(t + 1);
    for (int64_t d = 0; d < H / 16; ++d) {
      const __m256i x0 = v0 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v0 + 16 * d)) : _mm256_setzero_si256();
      const __m256i x1 = v1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v1 + 16 * d)) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1);
      _mm512_i32scatter_epi32(out + (16 * d) * 16 + t / 2, down, _mm512_permutexvar_epi16(zip, both), 4);
    }
  }
}

// The online-softmax step of query head i's group u over a block's scores S^T (st.s, a vector of
// the group's 16 queries per key; `live[t]`: the queries that see key t): the running max and sum
// updated, the probabilities written as P^T (st.p, bfloat16 pairs of keys per query), and the
// factor for the old accumulator returned (0 where there was none).
inline __m512 block_softmax(int64_t i, int64_t u, const __mmask16* live, AmxRunState& st) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  float* m = st.m + (i * kAmxGroups + u) * 16;
  float* l = st.l + (i * kAmxGroups + u) * 16;
  const __m512 m_old = _mm512_load_ps(m);
  __m512 top = ninf;
  for (int64_t t = 0; t < 32; ++t) top = _mm512_mask_max_ps(top, live[t], top, _mm512_load_ps(st.s + 16 * t));
  const __m512 m_new = _mm512_max_ps(m_old, top);
  const __m512 shift = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m_new, ninf, _CMP_NEQ_OQ), m_new);
  const __m512 rescale = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m_old, ninf, _CMP_NEQ_OQ),
                                             exp16(_mm512_sub_ps(m_old, shift)));
  const __m512i zip = pair_index();
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < 32; t += 2) {
    const __m512 p0 = _mm512_maskz_mov_ps(live[t], exp16(_mm512_sub_ps(_mm512_load_ps(st.s + 16 * t), shift)));
    const __m512 p1 = _mm512_maskz_mov_ps(live[t + 1], exp16(_mm512_sub_ps(_mm512_load_ps(st.s + 16 * t + 16), shift)));
    sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
    _mm512_store_si512(st.p + 8 * t, _mm512_permutexvar_epi16(zip, (__m512i)_mm512_cvtne2ps_pbh(p1, p0)));
  }
  _mm512_store_ps(l, _mm512_fmadd_ps(_mm512_load_ps(l), rescale, sum));
  _mm512_store_ps(m, m_new);
  return rescale;
}

#ifdef JAXINFER_ATTENTION_AMX
// One block of 32 keys for query head i and group u (its 16 queries in lanes; `live[t]`: the
// queries that see key t), the block's values in st: S^T = K Q^T on tiles 0, 6 (keys 0-15 /
// 16-31 as A, read in place from their pages with the cache's row stride; Q^T's 32-dim slices as
// B; slices alternate between tiles 2, 7, 1 and 4, 5, 3, so that a slice's loads need not wait for
// the previous slice's products), the online-softmax step of the 16 queries with one vector per
// key (no reduction across lanes), then (P V)^T for 64 head dims at a time on tiles 0, 5, 6, 7
// (V^T's slices in 1, 2, 4, then 1 again; P^T in 3), and the accumulators rescaled and summed.
template <int64_t H>
inline void amx_block_step(int64_t i, int64_t u, const uint16_t* const* keys, int64_t key_stride,
                           const __mmask16* live, AmxRunState& st) {
  const uint32_t* q_t = st.q_t + (i * kAmxGroups + u) * (H / 32) * 256;
  _tile_zero(0);
  _tile_zero(6);
  for (int64_t c = 0; c < H / 32; c += 2) {
    _tile_loadd(1, q_t + c * 256, 64);
    _tile_loadd(2, keys[0] + 32 * c, key_stride);
    _tile_dpbf16ps(0, 2, 1);
    if (keys[1]) {
      _tile_loadd(7, keys[1] + 32 * c, key_stride);
      _tile_dpbf16ps(6, 7, 1);
    }
    _tile_loadd(3, q_t + (c + 1) * 256, 64);
    _tile_loadd(4, keys[0] + 32 * (c + 1), key_stride);
    _tile_dpbf16ps(0, 4, 3);
    if (keys[1]) {
      _tile_loadd(5, keys[1] + 32 * (c + 1), key_stride);
      _tile_dpbf16ps(6, 5, 3);
    }
  }
  _tile_stored(0, st.s, 64);
  _tile_stored(6, st.s + 256, 64);
  const __m512 rescale = block_softmax(i, u, live, st);
  _tile_loadd(3, st.p, 64);
  for (int64_t d = 0; d < H / 16; d += 4) {
    _tile_zero(0);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    _tile_loadd(1, st.values_t + (16 * d) * 32, 64);
    _tile_dpbf16ps(0, 1, 3);
    _tile_loadd(2, st.values_t + (16 * d + 16) * 32, 64);
    _tile_dpbf16ps(5, 2, 3);
    _tile_loadd(4, st.values_t + (16 * d + 32) * 32, 64);
    _tile_dpbf16ps(6, 4, 3);
    _tile_loadd(1, st.values_t + (16 * d + 48) * 32, 64);
    _tile_dpbf16ps(7, 1, 3);
    _tile_stored(0, st.pv + (16 * d) * 16, 64);
    _tile_stored(5, st.pv + (16 * d + 16) * 16, 64);
    _tile_stored(6, st.pv + (16 * d + 32) * 16, 64);
    _tile_stored(7, st.pv + (16 * d + 48) * 16, 64);
  }
  float* acc = st.acc + (i * kAmxGroups + u) * H * 16;
  for (int64_t h = 0; h < H; ++h)
    _mm512_store_ps(acc + 16 * h, _mm512_fmadd_ps(_mm512_load_ps(acc + 16 * h), rescale, _mm512_load_ps(st.pv + 16 * h)));
}
#else
// `amx_block_step` on VDPBF16PS (no AMX): S^T kDpKeys keys at a time, each key's pair of head
// dims broadcast against Q^T's vector of that pair (16 queries' dims in lanes, as laid out for the
// tiles); then (P V)^T kDpDims head dims at a time, each dim's pair of values broadcast against
// P^T's vector of that key pair, summed straight into the rescaled accumulators. Keys of a
// missing second page score 0 (never live). The accumulators stay in registers.
constexpr int64_t kDpKeys = 16;  // a divisor of 16; 8 took 29.6 against 26.9 ms (header's probe)
constexpr int64_t kDpDims = 8;   // 16 took 29.0 against 27.5 ms

template <int64_t H>
inline void amx_block_step(int64_t i, int64_t u, const uint16_t* const* keys, int64_t key_stride,
                           const __mmask16* live, AmxRunState& st) {
  const uint32_t* q_t = st.q_t + (i * kAmxGroups + u) * (H / 32) * 256;  // pair p's vector at 16 p
  const int64_t row = key_stride / 2;
  for (int64_t t0 = 0; t0 < 32; t0 += kDpKeys) {
    __m512 sc[kDpKeys];
    for (int j = 0; j < kDpKeys; ++j) sc[j] = _mm512_setzero_ps();
    if (const uint16_t* page = keys[t0 / 16]) {
      const uint16_t* k[kDpKeys];
      for (int j = 0; j < kDpKeys; ++j) k[j] = page + ((t0 + j) % 16) * row;
      for (int64_t p = 0; p < H / 2; ++p) {
        const __m512bh qv = (__m512bh)_mm512_load_si512(q_t + 16 * p);
        for (int j = 0; j < kDpKeys; ++j) {
          uint32_t pair;
          std::memcpy(&pair, k[j] + 2 * p, sizeof(pair));
          sc[j] = _mm512_dpbf16_ps(sc[j], (__m512bh)_mm512_set1_epi32(int32_t(pair)), qv);
        }
      }
    }
    for (int j = 0; j < kDpKeys; ++j) _mm512_store_ps(st.s + 16 * (t0 + j), sc[j]);
  }
  const __m512 rescale = block_softmax(i, u, live, st);
  const uint32_t* vt = reinterpret_cast<const uint32_t*>(st.values_t);  // [dim][key pair]
  float* acc = st.acc + (i * kAmxGroups + u) * H * 16;
  for (int64_t h0 = 0; h0 < H; h0 += kDpDims) {
    __m512 a[kDpDims];
    for (int j = 0; j < kDpDims; ++j) a[j] = _mm512_mul_ps(_mm512_load_ps(acc + 16 * (h0 + j)), rescale);
    for (int64_t kp = 0; kp < 16; ++kp) {
      const __m512bh pv = (__m512bh)_mm512_load_si512(st.p + 16 * kp);
      for (int j = 0; j < kDpDims; ++j)
        a[j] = _mm512_dpbf16_ps(a[j], (__m512bh)_mm512_set1_epi32(int32_t(vt[(h0 + j) * 16 + kp])), pv);
    }
    for (int j = 0; j < kDpDims; ++j) _mm512_store_ps(acc + 16 * (h0 + j), a[j]);
  }
}
#endif  // JAXINFER_ATTENTION_AMX

// Rows [r0, r1) of one run on AMX (see above), its queries in groups of 16: each block's values
// are laid out once per KV head for all of the run's queries (its keys are read in place); a
// group with no key in a block skips it. The caller saved and restores the tile config.
template <int64_t H>
void attend_tile_amx(int64_t r0, int64_t r1, const Shape& s, const Inputs& in) {
  const int64_t K = s.K, G = s.G, N = K * G, n = r1 - r0, row = K * H, groups = (n + 15) / 16;
  static thread_local AmxRunState st;
  for (int64_t x = 0; x < N * kAmxGroups; ++x) {
    std::fill(st.m + 16 * x, st.m + 16 * x + 16, -std::numeric_limits<float>::infinity());
    std::fill(st.l + 16 * x, st.l + 16 * x + 16, 0.f);
  }
  std::fill(st.acc, st.acc + N * kAmxGroups * H * 16, 0.f);
  amx_queries<H>(r0, n, N, in.q, st);
  // per group: each query's keys [lo, ctx) as lanes (lo from the sliding window; past the run: none)
  __m512i lo[kAmxGroups], ctx[kAmxGroups];
  for (int64_t u = 0; u < groups; ++u) {
    const __mmask16 real = __mmask16(n - 16 * u >= 16 ? 0xFFFF : (1u << (n - 16 * u)) - 1);
    ctx[u] = _mm512_maskz_loadu_epi32(real, in.ctx + r0 + 16 * u);
    lo[u] = in.window > 0 ? _mm512_max_epi32(_mm512_setzero_si512(),
                                             _mm512_sub_epi32(_mm512_maskz_loadu_epi32(real, in.q_pos + r0 + 16 * u),
                                                              _mm512_set1_epi32(int32_t(in.window - 1))))
                          : _mm512_setzero_si512();
  }
  const int64_t first_key = in.window > 0 ? std::max<int64_t>(0, int64_t(in.q_pos[r0]) - in.window + 1) : 0;
  const uint16_t* k_cache = static_cast<const uint16_t*>(in.k);
  const uint16_t* v_cache = static_cast<const uint16_t*>(in.v);
  const int32_t* table = in.tables + r0 * s.W;
  const int64_t first = first_key / 16, end = (in.ctx[r1 - 1] + 15) / 16;
  __mmask16 live[kAmxGroups][32];  // per group and key of the block: the queries that see it
  for (int64_t page = first; page < end; page += 2) {
    const int64_t key0 = page * 16;  // position of the block's first key
    const uint16_t* kp[2] = {nullptr, nullptr};
    const uint16_t* vp[2] = {nullptr, nullptr};
    for (int64_t h = 0; h < 2 && page + h < end; ++h) {
      const int64_t base = (in.layer * s.NB + table[page + h]) * 16 * row;
      kp[h] = k_cache + base;
      vp[h] = v_cache + base;
    }
    const int64_t a = std::max<int64_t>(first_key - key0, 0), b = std::min<int64_t>(32, in.ctx[r1 - 1] - key0);
    bool group_live[kAmxGroups] = {};
    for (int64_t u = 0; u < groups; ++u) {
      __mmask16 any = 0;
      for (int64_t t = 0; t < 32; ++t) {
        const __m512i key = _mm512_set1_epi32(int32_t(key0 + t));
        live[u][t] = _mm512_cmplt_epi32_mask(key, ctx[u]) & _mm512_cmpge_epi32_mask(key, lo[u]);
        any |= live[u][t];
      }
      group_live[u] = any != 0;
    }
    for (int64_t kh = 0; kh < K; ++kh) {
      amx_block_values(vp, K, H, kh, a, b, st);
      const uint16_t* keys[2] = {kp[0] + kh * H, kp[1] ? kp[1] + kh * H : nullptr};
      for (int64_t g = 0; g < G; ++g)
        for (int64_t u = 0; u < groups; ++u)
          if (group_live[u]) amx_block_step<H>(kh * G + g, u, keys, row * 2, live[u], st);
    }
  }
  // back to the outputs' layout: m, l [R, N], acc [R, N, H]
  const __m512i by_query = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(int32_t(N * H)));
  for (int64_t u = 0; u < groups; ++u) {
    const int64_t nq = std::min<int64_t>(16, n - 16 * u);
    const __mmask16 real = __mmask16(nq >= 16 ? 0xFFFF : (1u << nq) - 1);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = 0; j < nq; ++j) {
        in.m[(r0 + 16 * u + j) * N + i] = st.m[(i * kAmxGroups + u) * 16 + j];
        in.l[(r0 + 16 * u + j) * N + i] = st.l[(i * kAmxGroups + u) * 16 + j];
      }
      const float* acc = st.acc + (i * kAmxGroups + u) * H * 16;
      float* out = in.acc + ((r0 + 16 * u) * N + i) * H;
      for (int64_t h = 0; h < H; ++h) _mm512_mask_i32scatter_ps(out + h, real, by_query, _mm512_load_ps(acc + 16 * h), 4);
    }
  }
}

// Whether a run of rows goes to `attend_run_amx` (bfloat16 pages of 16 tokens without scales, head
// dim 64, 128 or 256, AMX on); `run_items` plans runs of up to kMaxAmxRun queries then.
bool amx_applies(const Shape& s, const Inputs& in) {
  return s.bs == 16 && !in.k_scales && (s.H == 64 || s.H == 128 || s.H == 256) && amx_attention_on();
}

// A run on AMX (`amx_applies` held), under our tile configuration (amx_tiles.h).
void attend_run_amx(int64_t r0, int64_t r1, const Shape& s, const Inputs& in) {
  auto run = [&] {
    if (s.H == 64) attend_tile_amx<64>(r0, r1, s, in);
    else if (s.H == 128) attend_tile_amx<128>(r0, r1, s, in);
    else attend_tile_amx<256>(r0, r1, s, in);
  };
#ifdef JAXINFER_ATTENTION_AMX
  jaxinfer::with_our_tiles(run);
#else
  run();
#endif
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
// come without scales; 8-bit caches (jaxinfer/layers/attention/kv_quant.py) with theirs.
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
