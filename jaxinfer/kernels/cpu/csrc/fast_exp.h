// exp(x) for the kernels in this folder (paged_decode.cc's softmax, amx_gemm.cc's gated
// epilogue), scalar and 16 lanes. glibc's expf is a call per element (it was most of the
// attention kernel's time) and does not vectorize. jaxinfer/kernels/cpu/build.py hashes this header
// with each source.
//
// exp(x) = 2^n e^r with n = round(x log2 e) and r = x - n ln 2 (ln 2 in two parts, Cody-Waite),
// |r| <= ln 2 / 2; e^r by its Taylor polynomial to degree 7 (truncation < 3e-9 relative). x is
// clamped to [-87, 88], so the result is finite and > 0 for every input (exp(-87) ~ 1.6e-38,
// exp(88) ~ 1.65e38).
#ifndef JAXINFER_NATIVE_FAST_EXP_H_
#define JAXINFER_NATIVE_FAST_EXP_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace jaxinfer {

// log2(e), ln 2 in two parts, the clamp, and e^r's Taylor coefficients from degree 7 down to 0.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723e-6f,
                kExpMin = -87.f, kExpMax = 88.f;
constexpr float kExpTaylor[8] = {1.f / 5040, 1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};

// Written so that `omp simd` loops vectorize it.
inline float fast_exp(float x) {
  x = std::min(std::max(x, kExpMin), kExpMax);
  const float n = std::nearbyint(x * kLog2e);
  const float r = std::fma(n, -kLn2Hi, x) - n * kLn2Lo;
  float y = kExpTaylor[0];
  for (int i = 1; i < 8; ++i) y = std::fma(y, r, kExpTaylor[i]);
  const int32_t bits = (int32_t(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return y * two_n;
}

#ifdef __AVX512F__
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kExpMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  __m512 y = _mm512_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 8; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExpTaylor[i]));
  return _mm512_scalef_ps(y, n);
}
#endif

}  // namespace jaxinfer

#endif  // JAXINFER_NATIVE_FAST_EXP_H_
