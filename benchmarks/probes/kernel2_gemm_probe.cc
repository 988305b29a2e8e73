// Scratch probe (2026-12-02), not part of jaxinfer: could a native GEMM beat XLA:CPU on the dense layers?
// Build and run: g++ -O3 -march=native -std=c++17 -pthread gemm_probe.cc -o gemm_probe && ./gemm_probe
// Threads are spawned per call (121 calls per step): a real integration would use XLA's pool.
// Probe: SmolLM2's 30 dense layers + LM head as native GEMMs, f32 or bf16 weights packed in
// [N/64][K][64] panels, 2 threads split over panels. y = x W, x [M, K] f32.
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

template <typename T, int MR>
void panel(const float* x, int64_t M, int64_t K, const T* w, float* y, int64_t N, int64_t n0) {
  // w: panel [K][64]; y[:, n0:n0+64]
  for (int64_t m0 = 0; m0 < M; m0 += MR) {
    const int64_t mr = std::min<int64_t>(MR, M - m0);
    __m512 acc[MR][4];
    for (int r = 0; r < MR; ++r) for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
      const T* wk = w + k * 64;
      _mm_prefetch((const char*)(wk + 64 * 8), _MM_HINT_T0);
      __m512 w0 = load16(wk), w1 = load16(wk + 16), w2 = load16(wk + 32), w3 = load16(wk + 48);
      for (int r = 0; r < MR; ++r) {
        if (r >= mr) break;
        const __m512 xb = _mm512_set1_ps(x[(m0 + r) * K + k]);
        acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(xb, w2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(xb, w3, acc[r][3]);
      }
    }
    for (int r = 0; r < mr; ++r)
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(y + (m0 + r) * N + n0 + 16 * j, acc[r][j]);
  }
}

struct Mat { int64_t K, N; void* w; };
template <typename T>
void gemm(const float* x, int64_t M, const Mat& mat, float* y, int threads) {
  const int64_t panels = mat.N / 64;
  std::atomic<int64_t> next{0};
  auto work = [&]() {
    for (int64_t p; (p = next.fetch_add(1)) < panels;)
      panel<T, 6>(x, M, mat.K, (const T*)mat.w + p * mat.K * 64, y, mat.N, p * 64);
  };
  std::vector<std::thread> ts;
  for (int t = 1; t < threads; ++t) ts.emplace_back(work);
  work();
  for (auto& t : ts) t.join();
}

template <typename T>
double run(int64_t M, int threads, int reps) {
  const int64_t D = 576, F = 1536, V = 49152, L = 30;
  std::vector<Mat> mats;
  auto mk = [&](int64_t K, int64_t N) { Mat m{K, N, aligned_alloc(64, K * N * sizeof(T))}; memset(m.w, 0x3c, K * N * sizeof(T)); mats.push_back(m); };
  for (int l = 0; l < L; ++l) { mk(D, 960); mk(D, D); mk(D, 2 * F); mk(F, D); }
  mk(D, V);
  std::vector<float> x(M * 4096, 0.01f), y(M * V);
  double best = 1e9;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (auto& m : mats) gemm<T>(x.data(), M, m, y.data(), threads);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  for (auto& m : mats) free(m.w);
  return best * 1e3;
}

int main() {
  for (int64_t M : {1, 8, 32})
    for (int th : {1, 2})
      printf("M=%ld threads=%d  f32 %.1f ms  bf16 %.1f ms\n", M, th, run<float>(M, th, 5), run<uint16_t>(M, th, 5));
}
