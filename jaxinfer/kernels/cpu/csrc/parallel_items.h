// Work sharing over XLA's intra-op thread pool, for the FFI handlers in this folder
// (paged_decode.cc, bf16_gemv.cc). jaxinfer/kernels/cpu/build.py hashes this header with each source.
#ifndef JAXINFER_NATIVE_PARALLEL_ITEMS_H_
#define JAXINFER_NATIVE_PARALLEL_ITEMS_H_

#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace jaxinfer {

// Flush-to-zero and denormals-are-zero (MXCSR bits 15 and 6) on this thread while it lives,
// then the thread's own setting again. The kernels' exponentials underflow into subnormals
// that cost a microcode assist each; the flags are scoped so that nothing else in the
// process (numpy, XLA) loses its subnormals, as -ffast-math's crtfastmath.o made it do.
class ScopedFlushDenormals {
 public:
  ScopedFlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~ScopedFlushDenormals() { _mm_setcsr(saved_); }
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
  unsigned int saved_;
};

// Runs body(i) for every i in [0, total), each thread under ScopedFlushDenormals. Items are taken from a shared counter by the calling
// thread and by helpers scheduled on the pool; the call returns once every item is done. A
// helper that starts late finds no item left and touches nothing (the state it holds is
// reference counted).
template <typename Body>
void parallel_items(xla::ffi::ThreadPool& pool, int64_t total, Body body) {
  struct Progress {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto progress = std::make_shared<Progress>();
  auto work = [progress, total, body]() {
    ScopedFlushDenormals flush;
    for (int64_t i; (i = progress->next.fetch_add(1)) < total;) {
      body(i);
      progress->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), total) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule(decltype(work)(work));
  work();
  while (progress->done.load(std::memory_order_acquire) < total) {
  }
}

}  // namespace jaxinfer

#endif  // JAXINFER_NATIVE_PARALLEL_ITEMS_H_
