// Scratch probe (2026-12-02): one thread reading 12 KB pages (SmolLM2 f32 KV pages) of a 590 MB pool,
// in order, at random, and at random with a software prefetch of the next page(s); "huge" as an
// argument madvises the pool MADV_HUGEPAGE first. g++ -O3 -march=native page_read_bandwidth.cc -o bw && ./bw [huge]
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <sys/mman.h>
int main(int argc, char** argv) {
  const size_t page_floats = 16 * 3 * 64, npages = 30 * 1600;
  const size_t bytes = npages * page_floats * 4;
  float* buf = (float*)aligned_alloc(2 << 20, bytes);
  if (argc > 1) madvise(buf, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes / 4; ++i) buf[i] = 1.f;
  std::mt19937 rng(0);
  std::vector<size_t> order(npages);
  for (size_t i = 0; i < npages; ++i) order[i] = rng() % npages;
  for (int mode = 0; mode < 4; ++mode) {
    auto t0 = std::chrono::steady_clock::now();
    __m512 acc = _mm512_setzero_ps();
    size_t reads = 0;
    for (int rep = 0; rep < 3; ++rep)
      for (size_t i = 0; i < npages; ++i) {
        const float* p = buf + (mode ? order[i] : i) * page_floats;
        if (mode >= 2 && i + 1 < npages) { const char* nx = (const char*)(buf + order[i + 1] * page_floats); for (size_t b = 0; b < page_floats * 4; b += 64) __builtin_prefetch(nx + b); }
        if (mode == 3 && i + 2 < npages) { const char* nx = (const char*)(buf + order[i + 2] * page_floats); for (size_t b = 0; b < page_floats * 4; b += 256) __builtin_prefetch(nx + b); }
        for (size_t j = 0; j < page_floats; j += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(p + j));
        reads += page_floats * 4;
      }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%s: %.1f GB/s (%f)\n", mode == 0 ? "sequential" : mode == 1 ? "random" : mode == 2 ? "random+prefetch next" : "random+prefetch 2", reads / s / 1e9, _mm512_reduce_add_ps(acc));
  }
}
