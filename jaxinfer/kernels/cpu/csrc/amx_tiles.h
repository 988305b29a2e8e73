// The AMX tile configuration the kernels in this folder run under (amx_gemm.cc's products,
// paged_decode.cc's prefill runs): all eight tiles 16 rows of 64 bytes, set for the length of a
// work item and then undone, since XLA's own AMX kernels run on the same threads with theirs.
// jaxinfer/kernels/cpu/build.py hashes this header with each source.
#ifndef JAXINFER_NATIVE_AMX_TILES_H_
#define JAXINFER_NATIVE_AMX_TILES_H_

#if defined(__AMX_TILE__)
#include <immintrin.h>

#include <cstdint>

namespace jaxinfer {

struct TileConfig {  // the 64-byte operand of LDTILECFG (palette 1)
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Runs body() with tiles 0-7 configured as 16 rows x 64 bytes, then restores the thread's own
// configuration, or releases the tile state when it had none.
template <typename Body>
void with_our_tiles(Body body) {
  alignas(64) uint8_t saved[64];
  _tile_storeconfig(saved);
  TileConfig ours;
  for (int t = 0; t < 8; ++t) {
    ours.rows[t] = 16;
    ours.colsb[t] = 64;
  }
  _tile_loadconfig(&ours);
  body();
  if (saved[0] == 0)
    _tile_release();
  else
    _tile_loadconfig(saved);
}

}  // namespace jaxinfer

#endif  // __AMX_TILE__
#endif  // JAXINFER_NATIVE_AMX_TILES_H_
