// Copies between global memory (any dtype, row stride given, last dim contiguous) and
// float32 tiles in shared local memory. All work-items of the group share each copy.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "dtypes.hpp"

namespace ipex_flash {

// dst[r][c] = src[r * row_stride + c] for r < rows, c < cols; zero elsewhere, so padded rows
// and head-dim columns contribute nothing to the products that read the tile.
template <int ROWS, int COLS, typename T>
inline void load_tile(float (&dst)[ROWS][COLS], const T* src, int64_t row_stride, int rows,
                      int cols, int lid, int group_size) {
  for (int i = lid; i < ROWS * COLS; i += group_size) {
    const int r = i / COLS, c = i % COLS;
    dst[r][c] = (r < rows && c < cols) ? to_float(src[r * row_stride + c]) : 0.f;
  }
}

// Transposed and scaled: dst[c][r] = scale * src[r * row_stride + c]. Transposed so that
// consecutive work-items (one per row) read consecutive addresses: one vector load.
template <int ROWS, int COLS, typename T>
inline void load_tile_transposed(float (&dst)[COLS][ROWS], const T* src, int64_t row_stride,
                                 int rows, int cols, float scale, int lid, int group_size) {
  for (int i = lid; i < ROWS * COLS; i += group_size) {
    const int r = i / COLS, c = i % COLS;
    dst[c][r] = (r < rows && c < cols) ? scale * to_float(src[r * row_stride + c]) : 0.f;
  }
}

}  // namespace ipex_flash
