// The register tiles of matrix/registers.hpp emulated with sub-group arithmetic
// (IPEX_FLASH_MATRIX_EMULATE: the CPU device in tests): a lane's column of a tile is an array it
// owns, laid out as the engines lay out theirs. Included by matrix/registers.hpp only.
#pragma once

#include <sycl/sycl.hpp>

#include "common/dtypes.hpp"
#include "matrix/slm_tile.hpp"
#include "matrix/surface.hpp"

namespace ipex_flash {

template <typename T, int K, int N>
struct MatrixBRegisters {
  T column[K];  // lane n's column of B
};

template <int M, int N>
inline void matrix_acc_column(sycl::sub_group, MatrixAcc<M, N>& acc, float (&column)[M]) {
#pragma nounroll
  for (int m = 0; m < M; ++m) column[m] = acc.column[m];
}

template <int M, int N>
inline void matrix_acc_set_column(sycl::sub_group, MatrixAcc<M, N>& acc,
                                  const float (&column)[M]) {
#pragma nounroll
  for (int m = 0; m < M; ++m) acc.column[m] = column[m];
}

template <int M, int N>
inline void matrix_acc_scale_column(sycl::sub_group, MatrixAcc<M, N>& acc, float factor) {
#pragma nounroll
  for (int m = 0; m < M; ++m) acc.column[m] *= factor;
}

template <int K, typename T, int N>
inline void matrix_b_from_column(sycl::sub_group, MatrixBRegisters<T, K, N>& b, const T* column) {
#pragma nounroll
  for (int i = 0; i < K; ++i) b.column[i] = column[i];
}

template <int K, typename T, typename B>
inline void matrix_b_from_floats(sycl::sub_group, B& b, const float (&column)[K]) {
#pragma nounroll
  for (int i = 0; i < K; ++i) b.column[i] = from_float<T>(column[i]);
}

template <int ELEMENTS, int PARTS, typename T>
inline void matrix_prefetch_run(sycl::sub_group, const T*, int) {}  // nothing to hide here

// The emulation reads A element by element in the surface's order; the kernels' surfaces are
// whole padded blocks.
template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int TM, int TK, bool AL>
inline void matrix_mad_surface(sycl::sub_group, MatrixAcc<M, N> (&acc)[STRIPS],
                               const MatrixSurface<T, TM, TK, AL>& a, int row0,
                               MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  // As matrix_mad_strips' emulation: strip by strip, the column in registers.
#pragma unroll 1
  for (int s = 0; s < STRIPS; ++s) {
    float column[M];
#pragma nounroll
    for (int m = 0; m < M; ++m) column[m] = acc[s].column[m];
    for (int k = 0; k < DEPTH; ++k) {
      const float b_k = to_float(b[k / K].column[k % K]);
#pragma nounroll
      for (int m = 0; m < M; ++m)
        column[m] += to_float(*a.at(row0 + s * M + m, k)) * b_k;
    }
#pragma nounroll
    for (int m = 0; m < M; ++m) acc[s].column[m] = column[m];
  }
}

template <typename T, int M, int K, int N, int DEPTH, int STRIPS,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space, int TM,
          int TK, bool AL>
inline void matrix_mad_surface(sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
                               const MatrixSurface<T, TM, TK, AL>& a, int row0, const uint32_t* b,
                               int ldb) {
  if constexpr (!SurfaceOrder<TM, TK>::TILED) {
    matrix_mad_strips<T, M, K, N, DEPTH, STRIPS>(
        sg, acc, a.base + static_cast<int64_t>(row0) * a.pitch, a.pitch, b, ldb);
  } else {  // B's columns from its packed words (element (k, n): half k % 2 of word [k / 2][n])
    const int n = static_cast<int>(sg.get_local_id()[0]);
    MatrixBRegisters<T, K, N> columns[DEPTH / K];
    for (int k = 0; k < DEPTH; ++k) {
      const uint32_t word = b[k / 2 * ldb + n];
      columns[k / K].column[k % K] = from_bits<T>(k % 2 == 0 ? word & 0xffffu : word >> 16);
    }
    matrix_mad_surface<T, M, K, N, DEPTH, STRIPS>(sg, acc, a, row0, columns);
  }
}

template <typename T, int M, int K, int N, int STRIPS, int TM, int TK, bool AL>
inline void matrix_mad_surface_step(sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
                                    const MatrixSurface<T, TM, TK, AL>& a, int row0,
                                    MatrixBRegisters<T, K, N>& b) {
  MatrixBRegisters<T, K, N> one[1] = {b};
  matrix_mad_surface<T, M, K, N, K, STRIPS>(sg, acc, a, row0, one);
}

}  // namespace ipex_flash
