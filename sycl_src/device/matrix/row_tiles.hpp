// Tiles with the query rows as the accumulators' rows, the orientation sycl-tla's attention
// takes, for the decode kernel's matrix-engine form (decode/xmx_kernel.hpp):
//   S (rows, keys) = Q (rows, d) . K^T (d, keys)     Q: A tiles; K^T: B tiles read from K's rows
//   O (rows, dv) += P (rows, keys) . V (keys, dv)   P: A tiles (the caller puts S's elements,
//                                                    made probabilities, through SLM); V: B
//                                                    tiles read from its rows
// so that neither operand read from the cache needs a copy: K's rows are K^T's columns (the
// engines' 2-D block loads transpose 32-bit pairs on the way), V's rows are V's rows (packed
// into the engine's layout on the way). The accumulators keep the lane-column layout of
// matrix/registers.hpp: lane n holds column n (a key of S, a column of O), element i row i, so a
// row's statistics are the same element of every lane, reduced over the sub-group.
//
// B tiles come either straight from memory (keys_b_load, values_b_load: a whole tile of 16-bit
// rows) or from values each lane gathered for its own column (MatrixBRegisters and
// matrix_b_from_floats, matrix/registers.hpp: partial tiles, padded head dims, FP8 caches).
// Emulated (IPEX_FLASH_MATRIX_EMULATE), every operand is a lane's column, as the engines' B
// operands and accumulators are; an A tile's column n is lane n's (K = the sub-group's width),
// and the product reads its row from the other lanes.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "common/dtypes.hpp"
#include "common/kernel_props.hpp"
#include "matrix/registers.hpp"
#include "matrix/slm_tile.hpp"

namespace ipex_flash {

#ifndef IPEX_FLASH_MATRIX_EMULATE

template <typename T, int M, int K>
using RowsA = MatrixA<T, M, K>;
// K^T (d, keys) from K's rows: column n of the tile is key n's row.
template <typename T, int K, int N>
using KeysB = jm::joint_matrix<sycl::sub_group, typename MatrixElement<T>::type, jm::use::b, K,
                               N, jm::layout::col_major>;
// V (keys, dv) from V's rows.
template <typename T, int K, int N>
using ValuesB = jm::joint_matrix<sycl::sub_group, typename MatrixElement<T>::type, jm::use::b,
                                 K, N, jm::layout::row_major>;

// A tile of `ld`-element rows in local memory.
template <typename A, typename T>
__attribute__((always_inline)) inline void rows_a_load(sycl::sub_group sg, A& a, const T* slm,
                                                       int ld) {
  jm::joint_matrix_load(sg, a, matrix_ptr(slm), ld);
}

// The K x N tile of K^T whose column n is row n of `rows` (`stride` elements apart).
template <typename B, typename T>
__attribute__((always_inline)) inline void keys_b_load(sycl::sub_group sg, B& b, const T* rows,
                                                       int64_t stride) {
  jm::joint_matrix_load(sg, b, matrix_ptr<sycl::access::address_space::global_space>(rows),
                        stride);
}

// The K x N tile of V whose row k is row k of `rows`.
template <typename B, typename T>
__attribute__((always_inline)) inline void values_b_load(sycl::sub_group sg, B& b,
                                                         const T* rows, int64_t stride) {
  jm::joint_matrix_load(sg, b, matrix_ptr<sycl::access::address_space::global_space>(rows),
                        stride);
}

template <typename Acc, typename A, typename B>
__attribute__((always_inline)) inline void rows_mad(sycl::sub_group sg, Acc& c, A& a, B& b) {
  jm::joint_matrix_mad(sg, c, a, b, c);
}

#else  // IPEX_FLASH_MATRIX_EMULATE

template <typename T, int M, int K>
struct RowsA {
  float column[M];  // lane n: A (i, n), exactly a T
};
template <typename T, int K, int N>
using KeysB = MatrixBRegisters<T, K, N>;
template <typename T, int K, int N>
using ValuesB = MatrixBRegisters<T, K, N>;

template <typename T, int M, int K>
inline void rows_a_load(sycl::sub_group sg, RowsA<T, M, K>& a, const T* slm, int ld) {
  const int n = static_cast<int>(sg.get_local_id()[0]);
  for (int i = 0; i < M; ++i) a.column[i] = to_float(slm[i * ld + n]);
}

template <typename T, int K, int N>
inline void keys_b_load(sycl::sub_group sg, MatrixBRegisters<T, K, N>& b, const T* rows,
                        int64_t stride) {
  const int n = static_cast<int>(sg.get_local_id()[0]);
  for (int k = 0; k < K; ++k) b.column[k] = rows[n * stride + k];
}

template <typename T, int K, int N>
inline void values_b_load(sycl::sub_group sg, MatrixBRegisters<T, K, N>& b, const T* rows,
                          int64_t stride) {
  const int n = static_cast<int>(sg.get_local_id()[0]);
  for (int k = 0; k < K; ++k) b.column[k] = rows[k * stride + n];
}

// c (i, n) += sum over k of A (i, k) B (k, n): A (i, k) is lane k's.
template <int M, int N, typename T, int K>
inline void rows_mad(sycl::sub_group sg, MatrixAcc<M, N>& c, RowsA<T, M, K>& a,
                     MatrixBRegisters<T, K, N>& b) {
  for (int k = 0; k < K; ++k) {
    const float b_k = to_float(b.column[k]);
    for (int i = 0; i < M; ++i) c.column[i] += sycl::select_from_group(sg, a.column[i], k) * b_k;
  }
}

#endif  // IPEX_FLASH_MATRIX_EMULATE

// Every element of every accumulator of `tiles` set to `value`.
template <typename Acc, int ROW_TILES, int TILES>
__attribute__((always_inline)) inline void rows_fill(sycl::sub_group sg,
                                                     Acc (&tiles)[ROW_TILES][TILES], float value) {
IPEX_FLASH_TILE_LOOP
  for (int rt = 0; rt < ROW_TILES; ++rt)
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < TILES; ++t) matrix_fill(sg, tiles[rt][t], value);
}

// The row maxima of `tiles` accumulators (lane columns), into lanes: lane row0 + i of `lanes`
// becomes the max over their row i (other lanes keep theirs). A row's statistics held so, one
// register for all rows, rather than one register per row (each the same in every lane), left
// the 16-row decode its registers for O (gpu-check, BMG).
template <int M, typename Acc, int TILES>
__attribute__((always_inline)) inline void rows_max_into_lanes(sycl::sub_group sg,
                                                               Acc (&tiles)[TILES], int row0,
                                                               float& lanes) {
  float out[M], column[M];
  matrix_acc_column(sg, tiles[0], out);
IPEX_FLASH_TILE_LOOP
  for (int t = 1; t < TILES; ++t) {
    matrix_acc_column(sg, tiles[t], column);
IPEX_FLASH_TILE_LOOP
    for (int i = 0; i < M; ++i) out[i] = sycl::fmax(out[i], column[i]);
  }
  const int lane = static_cast<int>(sg.get_local_linear_id());
IPEX_FLASH_TILE_LOOP
  for (int i = 0; i < M; ++i) {
    const float row_max = sycl::reduce_over_group(sg, out[i], sycl::maximum<float>());
    if (lane == row0 + i) lanes = row_max;
  }
}

// Lane `lane`'s value of `lanes` in every lane (a lane known at compile time once unrolled: a
// move from a scalar region on the engines).
__attribute__((always_inline)) inline float from_lane(sycl::sub_group sg, float lanes, int lane) {
  return sycl::group_broadcast(sg, lanes, lane);
}

// Multiplies row i of `tile` by lane row0 + i's value of `factor_lanes`. (joint_matrix_apply
// with an element counter, the form before, left its loop rolled in the larger decode kernels
// and their O in private memory.)
template <int M, typename Acc>
__attribute__((always_inline)) inline void row_scale_tile(sycl::sub_group sg, Acc& tile,
                                                          float factor_lanes, int row0) {
#if defined(IPEX_FLASH_MATRIX_EMULATE)
  for (int i = 0; i < M; ++i) tile.column[i] *= from_lane(sg, factor_lanes, row0 + i);
#else
  float column[M];
  matrix_acc_column(sg, tile, column);
#pragma unroll
  for (int i = 0; i < M; ++i) column[i] *= from_lane(sg, factor_lanes, row0 + i);
  matrix_acc_set_column(sg, tile, column);
#endif
}

}  // namespace ipex_flash
