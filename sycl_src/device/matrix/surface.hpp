// A matrix in global memory whose A tiles the register kernels read by their coordinates
// (matrix/registers.hpp), in one of two orders:
// - row-major (TILE_M = 0), for GPUs with 2-D block loads (PVC, BMG, Lunar Lake): a load's
//   descriptor (base, extent, pitch) is then the same for every tile and only the coordinates
//   change, where a pointer per tile costs the descriptor's setup, scalar instructions beside
//   every DPAS of the forward's main loop (docs/gpus.md);
// - tile by tile (TILE_M x TILE_K tiles, each contiguous and row-major, the tiles in row-major
//   order), for the 8-wide engines (Arc A-series, Arrow Lake-H), which have no 2-D block loads:
//   an A tile whose rows lie apart costs one load and one 64-bit address (emulated there) per
//   row, instructions that outnumber the DPAS many times over (docs/gpus.md); a contiguous tile
//   is one block read.
// The packed copies (forward/pack_kv.hpp) are written in the order their readers take.
#pragma once

#include <cstdint>
#include <type_traits>

namespace ipex_flash {

// Where element (row, col) of a (rows x cols) matrix lies, in elements from its start.
template <int TILE_M, int TILE_K>
struct SurfaceOrder {
  static constexpr bool TILED = TILE_M > 0;
  static_assert(TILED == (TILE_K > 0), "both tile sides, or neither");

  static inline int64_t offset(int row, int col, int cols, int pitch) {
    if constexpr (TILED)
      return (static_cast<int64_t>(row / TILE_M) * (cols / TILE_K) + col / TILE_K) *
                 (TILE_M * TILE_K) +
             row % TILE_M * TILE_K + col % TILE_K;
    else
      return static_cast<int64_t>(row) * pitch + col;
  }

  // The inverse, for writers walking the storage in order: the row and column of element i.
  static inline void coordinates(int64_t i, int cols, int& row, int& col) {
    if constexpr (TILED) {
      const int64_t tile = i / (TILE_M * TILE_K);
      const int within = static_cast<int>(i % (TILE_M * TILE_K));
      const int tiles_per_row = cols / TILE_K;
      row = static_cast<int>(tile / tiles_per_row) * TILE_M + within / TILE_K;
      col = static_cast<int>(tile % tiles_per_row) * TILE_K + within % TILE_K;
    } else {
      row = static_cast<int>(i / cols);
      col = static_cast<int>(i % cols);
    }
  }

  // dst (rows x cols, in this order) = src (row-major), work-item lid of group_size writing
  // every group_size-th element, so consecutive work-items write consecutive addresses.
  template <typename T>
  static inline void copy_from_rows(T* dst, const T* src, int rows, int cols, int lid,
                                    int group_size) {
    for (int64_t i = lid; i < static_cast<int64_t>(rows) * cols; i += group_size) {
      int row, col;
      coordinates(i, cols, row, col);
      dst[i] = src[static_cast<int64_t>(row) * cols + col];
    }
  }
};

// OR_OFFSETS: `base` lies at a multiple of a power of two beyond every byte read from it, so an
// element's address is base OR its byte offset: one 32-bit instruction, where the 8-wide
// engines (DG2, Arrow Lake-H) emulate a 64-bit add in about five (the register forward's K and
// V^T, in a pack whose blocks the host so aligns: forward_launch.cpp, pack_alignment).
template <typename T, int TILE_M = 0, int TILE_K = 0, bool OR_OFFSETS = false>
struct MatrixSurface {
  using Order = SurfaceOrder<TILE_M, TILE_K>;
  const T* base;
  int rows, cols, pitch;  // pitch: elements from one row to the next (row-major order only)

  inline int64_t offset(int row, int col) const { return Order::offset(row, col, cols, pitch); }

  inline const T* at(int row, int col) const {
    if constexpr (OR_OFFSETS) {
      const auto bytes = static_cast<uint32_t>(offset(row, col) * sizeof(T));
      return reinterpret_cast<const T*>(reinterpret_cast<uintptr_t>(base) | bytes);
    } else {
      return base + offset(row, col);
    }
  }
};

// The order the register kernels read their packed A surfaces in: row by row with the 2-D
// block loads that come with N = 16 (PVC, Xe2), tile by tile (M x K tiles) on the 8-wide
// engines, and in their emulations, which so read what the engines read.
template <typename T, int M, int K, int N, bool OR_OFFSETS = false>
using PackedSurface =
    std::conditional_t<N == 16, MatrixSurface<T>, MatrixSurface<T, M, K, OR_OFFSETS>>;

}  // namespace ipex_flash
