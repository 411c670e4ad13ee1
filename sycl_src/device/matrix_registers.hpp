// Matrix tiles kept in registers between products, read and written by lane columns: the
// forward kernel of flash_fwd_matrix_registers.hpp holds its score and output accumulators and
// its P operand here instead of in SLM.
//
// Lane columns: lane n of the sub-group holds column n of an accumulator (M x N), its element
// i being row i, and column n of a B operand (K x N), its element i being row k = i. That is
// how the XMX engines lay out DPAS operands on every Intel GPU with them (row m of an
// accumulator is one register, one lane per column; a packed B register holds rows 2w and 2w+1
// of each lane's column), and how the emulation (matrix_tile.hpp) lays them out by
// construction. The host builds this kernel only where the layout holds
// (DeviceLimits::matrix_lane_columns): not on the CPU device's AMX, whose tiles are a different
// register file altogether (the SLM-staged flash_fwd_matrix.hpp serves it).
//
// The attention kernels own one query row per lane, computed transposed (the query is the
// accumulators' column), so a lane's column of S^T is its row's scores, and a row's softmax
// needs no exchange between lanes.
#pragma once

#include <sycl/sycl.hpp>

#include "dtypes.hpp"
#include "matrix_tile.hpp"

namespace ipex_flash {

#ifndef IPEX_FLASH_MATRIX_EMULATE

template <typename T, int K, int N>
using MatrixBRegisters = MatrixB<T, K, N>;

// Templated on the tile types: joint_matrix's sizes are size_t, which MatrixAcc<int M, int N>
// cannot deduce.
// The lane's column of accumulator `acc` (M rows): column[i] = acc (i, lane).
template <typename Acc, int M>
__attribute__((always_inline)) inline void matrix_acc_column(sycl::sub_group sg, Acc& acc,
                                                             float (&column)[M]) {
  auto data = sycl::ext::oneapi::detail::get_wi_data(sg, acc);
#pragma unroll
  for (int i = 0; i < M; ++i) column[i] = data[i];
}

// Multiplies the lane's column of `acc` by `factor` (one factor per query row).
template <typename Acc>
__attribute__((always_inline)) inline void matrix_acc_scale_column(sycl::sub_group sg, Acc& acc,
                                                                   float factor) {
  jm::joint_matrix_apply(sg, acc, [=](float& x) { x *= factor; });
}

// The lane's column of a B operand from K values in T (column[i] = B (i, lane)).
template <int K, typename B, typename T>
__attribute__((always_inline)) inline void matrix_b_from_column(sycl::sub_group sg, B& b,
                                                                const T* column) {
  using E = typename MatrixElement<T>::type;
  auto data = sycl::ext::oneapi::detail::get_wi_data(sg, b);
#pragma unroll
  for (int i = 0; i < K; ++i) data[i] = sycl::bit_cast<E>(column[i]);
}

// acc[s] (M x N) += A_s (M x DEPTH) . B, for A_s the s-th M-row strip of A (row stride lda, in
// A_SPACE) and B the DEPTH / K operands b[] held in registers.
template <typename T, int M, int K, int N, int DEPTH, int STRIPS,
          sycl::access::address_space A_SPACE = sycl::access::address_space::global_space>
__attribute__((always_inline)) inline void matrix_mad_registers(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const T* a, int64_t lda,
    MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  MatrixA<T, M, K> a_tile;
#pragma unroll
  for (int k = 0; k < DEPTH; k += K) {
#pragma unroll
    for (int s = 0; s < STRIPS; ++s) {
      jm::joint_matrix_load(sg, a_tile, matrix_ptr<A_SPACE>(a + s * M * lda + k),
                            static_cast<size_t>(lda));
      jm::joint_matrix_mad(sg, acc[s], a_tile, b[k / K], acc[s]);
    }
  }
}

#else  // IPEX_FLASH_MATRIX_EMULATE

template <typename T, int K, int N>
struct MatrixBRegisters {
  T column[K];  // lane n's column of B
};

template <int M, int N>
inline void matrix_acc_column(sycl::sub_group, MatrixAcc<M, N>& acc, float (&column)[M]) {
#pragma unroll
  for (int m = 0; m < M; ++m) column[m] = acc.column[m];
}

template <int M, int N>
inline void matrix_acc_scale_column(sycl::sub_group, MatrixAcc<M, N>& acc, float factor) {
#pragma unroll
  for (int m = 0; m < M; ++m) acc.column[m] *= factor;
}

template <int K, typename T, int N>
inline void matrix_b_from_column(sycl::sub_group, MatrixBRegisters<T, K, N>& b, const T* column) {
#pragma unroll
  for (int i = 0; i < K; ++i) b.column[i] = column[i];
}

template <typename T, int M, int K, int N, int DEPTH, int STRIPS,
          sycl::access::address_space A_SPACE = sycl::access::address_space::global_space>
inline void matrix_mad_registers(sycl::sub_group, MatrixAcc<M, N> (&acc)[STRIPS], const T* a,
                                 int64_t lda, MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  // As matrix_mad_strips' emulation: strip by strip, the column in registers.
#pragma unroll 1
  for (int s = 0; s < STRIPS; ++s) {
    float column[M];
#pragma unroll
    for (int m = 0; m < M; ++m) column[m] = acc[s].column[m];
    const T* a_strip = a + static_cast<int64_t>(s) * M * lda;
    for (int k = 0; k < DEPTH; ++k) {
      const float b_k = to_float(b[k / K].column[k % K]);
#pragma unroll
      for (int m = 0; m < M; ++m) column[m] += to_float(a_strip[m * lda + k]) * b_k;
    }
#pragma unroll
    for (int m = 0; m < M; ++m) acc[s].column[m] = column[m];
  }
}

#endif  // IPEX_FLASH_MATRIX_EMULATE

}  // namespace ipex_flash
