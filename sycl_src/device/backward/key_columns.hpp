// The register dK/dV kernel's work on a lane's key column (backward/dkdv_registers_kernel.hpp):
// the products that give S or dP over a slab of query rows as each lane's column, the dK^T or
// dV^T step that consumes a slab's P or dS, the broadcast of the rows' statistics and the store
// of a key's row. Each reads its A operands in 2-D blocks where the packed surface is row-major
// (PVC, BMG, Lunar Lake) and a tile per load where it is tile by tile (the 8-wide engines).
#pragma once

#include <sycl/sycl.hpp>

#include "matrix/block_io.hpp"
#include "matrix/registers.hpp"

namespace ipex_flash {

// values[j] = lane j's lane_value (a row statistic loaded by the lane that owns the row): the
// lane index is a constant, which the GPU compiler reads as a register region.
template <int LANES>
__attribute__((always_inline)) inline void broadcast_lanes(sycl::sub_group sg, float lane_value,
                                                          float (&values)[LANES]) {
#pragma unroll
  for (int j = 0; j < LANES; ++j) values[j] = sycl::select_from_group(sg, lane_value, j);
}

// out[j] = column[j] rounded once to T.
template <typename T, int R>
__attribute__((always_inline)) inline void round_into(const float (&column)[R], T* out) {
#pragma unroll
  for (int j = 0; j < R; ++j) out[j] = from_float<T>(column[j]);
}

// The lane's column of the score tiles (S or dP) over a whole slab of rows, chunk by chunk.
template <int M, int SLAB, typename Acc, int TILES>
__attribute__((always_inline)) inline void slab_of_columns(sycl::sub_group sg,
                                                           Acc (&tiles)[TILES],
                                                           float (&column)[SLAB]) {
#pragma unroll
  for (int c0 = 0; c0 < SLAB; c0 += MATRIX_KEY_CHUNK) {
    float chunk[MATRIX_KEY_CHUNK];
    chunk_of_columns<M>(sg, tiles, c0, chunk);
#pragma unroll
    for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) column[c0 + j] = chunk[j];
  }
}

// The lane's column of A (K rows from `row0`, HEAD_DIM deep) . B, B the sub-group's keys' tiles
// of K^T or V^T (pairs of head-dim rows, LDB words apart): S or dP over one slab of rows. A in
// 2-D blocks where the surface is row-major, a tile per load where it is tile by tile.
template <typename T, int M, int K, int N, int HEAD_DIM, int LDB, int TM, int TK, bool AL>
__attribute__((always_inline)) inline void slab_product_columns(
    sycl::sub_group sg, const MatrixSurface<T, TM, TK, AL>& a, int row0, const uint32_t* b,
    float (&column)[K]) {
  constexpr auto GLOBAL = sycl::access::address_space::global_space;
  MatrixAcc<M, N> tiles[K / M];
#pragma unroll
  for (int t = 0; t < K / M; ++t) matrix_fill(sg, tiles[t], 0.f);
  if constexpr (SurfaceOrder<TM, TK>::TILED)
    matrix_mad_surface<T, M, K, N, HEAD_DIM, K / M, GLOBAL>(sg, tiles, a, row0, b, LDB);
  else
    matrix_mad_surface_wide<T, M, K, N, HEAD_DIM, K / M, K, GLOBAL>(sg, tiles, a, row0, b, LDB);
  slab_of_columns<M>(sg, tiles, column);
}

// acc (TILES x M rows from row0, N) += A (those rows of `cols`, Q^T or dO^T of the query
// block, at columns col .. col + K) . b, one reduction step: in 2-D blocks where the surface is
// row-major, a tile per load where it is tile by tile.
template <typename T, int M, int K, int N, int TILES, int TM, int TK, bool AL>
__attribute__((always_inline)) inline void slab_gradient_step(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[TILES], const MatrixSurface<T, TM, TK, AL>& cols,
    int row0, int col, MatrixBRegisters<T, K, N>& b) {
  if constexpr (SurfaceOrder<TM, TK>::TILED) {
    const MatrixSurface<T, TM, TK, AL> slab{cols.base + cols.offset(0, col), cols.rows,
                                            cols.cols, cols.pitch};
    matrix_mad_surface_step<T, M, K, N, TILES>(sg, acc, slab, row0, b);
  } else {
    matrix_mad_surface_step_wide<T, M, K, N, TILES>(sg, acc, cols, row0, col, b);
  }
}

// Writes the lane's key's row of `tiles` (its column of each, HEAD_DIM values), times `scale`,
// to `out`'s first `cols` columns; lanes past the sequence write nothing.
template <int M, typename T, typename Acc, int TILES>
__attribute__((always_inline)) inline void store_key_row(sycl::sub_group sg, Acc (&tiles)[TILES],
                                                         T* out, int cols, float scale,
                                                         bool in_sequence) {
  float row[TILES * M];
  lane_row_of_tiles<M>(sg, tiles, row);
  if (!in_sequence) return;
#pragma unroll
  for (int d = 0; d < TILES * M; ++d)
    if (d < cols) out[d] = from_float<T>(row[d] * scale);
}

}  // namespace ipex_flash
