// Products of many rows against pre-packed bfloat16 weights on Intel AMX, as an XLA FFI custom
// call ("jaxinfer_amx_gemm"). Built and registered by jaxinfer/native_amx.py; called from
// jaxinfer/models/cpu_bf16.py for the layers' and the LM head's products of 3 rows or more.
//
// Why: XLA:CPU (jax 0.10.2) multiplies a bfloat16 dot on AMX too (YNNPACK), but it re-packs the
// weight operand into AMX's pair-interleaved layout on every call, and under the layer scan it
// first copies each layer's slice out of the stacked weights: in a 32-row decode step of
// SmolLM2-135M the weights were read, copied, re-read and re-packed every step. Here the weights
// are packed once, at load (`native_amx.pack`), every layer in one stacked array read in place
// through the layer index: each weight is read once per step, straight into the tiles.
//
// Layout of one layer's packed weight w [K, N] (K and N multiples of 32):
//   [N / 16, K / 32, 16, 16, 2]: block (j, b) is the 16 x 32 slice w[32b : 32b + 32, 16j : 16j + 16]
//   as AMX's B operand: row p holds, for each of its 16 columns, the pair w[32b + 2p], w[32b + 2p + 1]
//   (Intel's "VNNI" layout for TDPBF16PS).
// Inputs: x bf16 or u16 [M, K]; w u16 [L, N / 16, K / 32, 16, 16, 2]; layer s32 [].
// Output: y f32 [M, N] = x w[layer]: bfloat16 operands, float32 sums (as lax.dot_general with
// preferred_element_type=float32, summed in another order).
//
// Work: pairs of 16-column blocks are spread over XLA's intra-op threads; each item loops over
// the rows 32 at a time (two A tiles, four C tiles of 16 x 16 float32). The thread's tile
// configuration is saved and restored around an item, since XLA's own AMX kernels run on the
// same threads.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel_items.h"
#include "xla/ffi/api/ffi.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#define JAXINFER_AMX 1
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
struct TileConfig {  // the 64-byte operand of LDTILECFG (palette 1)
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: C (rows 0-15 / 16-31 of column blocks j / j + 1); 4, 5: A (rows 0-15 / 16-31);
// 6, 7: B (column blocks j / j + 1). Every tile is 16 rows of 64 bytes.
TileConfig our_config() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  return c;
}

// Weight blocks are prefetched this many K blocks (2 KB of each column-block pair) ahead of the
// tile loads. A weight block is read once per call and this CPU's L3 (105 MB) holds less than the
// model, so it comes from DRAM; a tile load cannot start before the products still reading its
// tile are done, so without prefetch every block waits out DRAM's latency. Probe (30 scanned
// products, 8 weight stacks in rotation, 0 against 4 ahead alternated in one process,
// benchmarks/results/2026-12-03-cpu2-amx-attention/probes/amx_prefetch_ab.py): 32 x 576 x 1536
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

// Column blocks j, j + 1 for rows [m0, m0 + 32) of a (32-row, K) panel `a` with row stride `lda`
// (elements), into c (32 x 32 float32, row stride `ldc` floats). `full`: all 32 rows are real
// (else only the first 16 are computed).
void panel(const uint16_t* a, int64_t lda, const Problem& p, int64_t j, bool full, float* c, int64_t ldc) {
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

// Column-block pairs [q0, q1) (pair q: blocks 2q, 2q + 1) for every row.
void columns(const Problem& p, int64_t q0, int64_t q1) {
  alignas(64) float c[32 * 32];
  alignas(64) uint8_t saved[64];
  _tile_storeconfig(saved);
  const TileConfig ours = our_config();
  _tile_loadconfig(&ours);
  for (int64_t m0 = 0; m0 < p.M; m0 += 32) {
    const int64_t rows = std::min<int64_t>(32, p.M - m0);
    const uint16_t* a = rows < 32 ? p.tail : p.x + m0 * p.K;
    for (int64_t q = q0; q < q1; ++q) {
      if (rows == 32) {
        panel(a, p.K, p, 2 * q, true, p.y + m0 * p.N + 32 * q, p.N);
        continue;
      }
      panel(a, p.K, p, 2 * q, rows > 16, c, 32);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(p.y + (m0 + r) * p.N + 32 * q, c + r * 32, 32 * sizeof(float));
    }
  }
  if (saved[0] == 0)
    _tile_release();  // the thread had no configuration before
  else
    _tile_loadconfig(saved);
}
#endif

ffi::Error gemm(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::U16> w, ffi::Buffer<ffi::S32> layer,
                ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 6 || wd[3] != 16 || wd[4] != 16 || wd[5] != 2 ||
      (x.element_type() != ffi::U16 && x.element_type() != ffi::BF16))
    return ffi::Error::InvalidArgument("amx_gemm: x bf16 [M, K] and w u16 [L, N/16, K/32, 16, 16, 2] expected");
  const int64_t L = wd[0], N = wd[1] * 16, K = wd[2] * 32, M = xd[0];
  const int64_t l = layer.typed_data()[0];
  if (xd[1] != K || K > kMaxK || N % 32 != 0 || l < 0 || l >= L)
    return ffi::Error::InvalidArgument("amx_gemm: K differs from x's, exceeds the limit, N is not a multiple of 32 "
                                       "or the layer is out of range");
#ifdef JAXINFER_AMX
  const auto* xs = static_cast<const uint16_t*>(x.untyped_data());
  // The last rows past a multiple of 32, zero-padded to a whole panel once for every item.
  const int64_t whole = M / 32 * 32;
  std::vector<uint16_t> tail(M > whole ? 32 * K : 0, 0);
  std::copy(xs + whole * K, xs + M * K, tail.data());
  const Problem p{xs, tail.empty() ? nullptr : tail.data(), w.typed_data() + l * N * K, y->typed_data(), M, K, N};
  const int64_t pairs = N / 32;
  const int64_t per_item = std::max<int64_t>(1, pairs / (8 * std::max<int64_t>(1, pool.num_threads())));
  const int64_t items = (pairs + per_item - 1) / per_item;
  jaxinfer::parallel_items(pool, items, [p, per_item, pairs](int64_t i) {
    columns(p, i * per_item, std::min(pairs, (i + 1) * per_item));
  });
  return ffi::Error::Success();
#else
  (void)M;
  return ffi::Error::InvalidArgument("amx_gemm: built without AMX (this CPU lacks amx_tile / amx_bf16)");
#endif
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferAmxGemm, gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()           // x
                                  .Arg<ffi::Buffer<ffi::U16>>()    // packed w
                                  .Arg<ffi::Buffer<ffi::S32>>()    // layer
                                  .Ret<ffi::Buffer<ffi::F32>>());  // y
