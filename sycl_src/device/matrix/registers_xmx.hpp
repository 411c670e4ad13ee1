// The register tiles of matrix/registers.hpp on the matrix engines (XMX): joint_matrix tiles
// whose lane columns are read and written through their elements, and products over A tiles
// read from a surface. Included by matrix/registers.hpp only.
#pragma once

#include <sycl/sycl.hpp>

#include "common/dtypes.hpp"
#include "matrix/slm_tile.hpp"
#include "matrix/surface.hpp"

namespace ipex_flash {

template <typename T, int K, int N>
using MatrixBRegisters = MatrixB<T, K, N>;

// Templated on the tile types: joint_matrix's sizes are size_t, which MatrixAcc<int M, int N>
// cannot deduce. Elements are reached through get_wi_data with constant indices:
// joint_matrix_apply runs to a length only the GPU compiler knows, and filling a B operand
// through it, element by element with a counter, made IGC (ocloc 26.27) drop the kernel's
// products altogether.
// The lane's column of accumulator `acc` (M rows): column[i] = acc (i, lane).
template <typename Acc, int M>
__attribute__((always_inline)) inline void matrix_acc_column(sycl::sub_group sg, Acc& acc,
                                                             float (&column)[M]) {
  auto data = sycl::ext::oneapi::detail::get_wi_data(sg, acc);
#pragma unroll
  for (int i = 0; i < M; ++i) column[i] = data[i];
}

// Sets the lane's column of `acc`: acc (i, lane) = column[i].
template <typename Acc, int M>
__attribute__((always_inline)) inline void matrix_acc_set_column(sycl::sub_group sg, Acc& acc,
                                                                 const float (&column)[M]) {
  auto data = sycl::ext::oneapi::detail::get_wi_data(sg, acc);
#pragma unroll
  for (int i = 0; i < M; ++i) data[i] = column[i];
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

// The same from K float values, each rounded once to the operand's type.
template <int K, typename T, typename B>
__attribute__((always_inline)) inline void matrix_b_from_floats(sycl::sub_group sg, B& b,
                                                                const float (&column)[K]) {
  using E = typename MatrixElement<T>::type;
  auto data = sycl::ext::oneapi::detail::get_wi_data(sg, b);
#pragma unroll
  for (int i = 0; i < K; ++i) data[i] = sycl::bit_cast<E>(from_float<T>(column[i]));
}

// The A tile at (row, col) of `surface`: by its coordinates where the surface is row-major
// (2-D block loads); from its address where it is tile by tile (the 8-wide engines, which have
// neither 2-D block loads nor joint_matrix_load_checked: IGC refuses it for them).
template <typename A, typename T, int TM, int TK, bool AL>
__attribute__((always_inline)) inline void matrix_load_a(
    sycl::sub_group sg, A& a, const MatrixSurface<T, TM, TK, AL>& surface, int row, int col) {
  // (Surfaces without OR_OFFSETS keep the sum written here: through at(), the 8-wide dK/dV
  // kernel at d = 128 spilled 64 bytes, IGC's allocation of the same arithmetic.)
  if constexpr (SurfaceOrder<TM, TK>::TILED && AL)
    jm::joint_matrix_load(
        sg, a, matrix_ptr<sycl::access::address_space::global_space>(surface.at(row, col)), TK);
  else if constexpr (SurfaceOrder<TM, TK>::TILED)
    jm::joint_matrix_load(
        sg, a, matrix_ptr<sycl::access::address_space::global_space>(
                   surface.base + surface.offset(row, col)),
        TK);
  else
    sycl::ext::intel::experimental::matrix::joint_matrix_load_checked(
        sg, a, matrix_ptr<sycl::access::address_space::global_space>(surface.base),
        surface.pitch, surface.rows, surface.cols, row, col);
}

// Asks for a contiguous run of ELEMENTS to be brought into the cache ahead of its loads, share
// `part` of PARTS (a sub-group's), as 2-D block prefetches: 32 rows of 64 bytes each, the
// widest a prefetch takes. Chunk c goes to part c % PARTS; where the chunks do not split evenly
// (head dims 16 and 48: 2 and 6 chunks for 4 parts) the last round skips the parts past them.
template <int ELEMENTS, int PARTS, typename T>
__attribute__((always_inline)) inline void matrix_prefetch_run(sycl::sub_group sg, const T* base,
                                                               int part) {
  namespace syclex = sycl::ext::oneapi::experimental;
  using E = typename MatrixElement<T>::type;
  constexpr int WIDTH = 64 / sizeof(T), ROWS = 32, CHUNK = WIDTH * ROWS;
  constexpr int CHUNKS = ELEMENTS / CHUNK;
  static_assert(ELEMENTS % CHUNK == 0, "whole chunks");
#pragma unroll
  for (int i = 0; i < (CHUNKS + PARTS - 1) / PARTS; ++i) {
    const int chunk = part + i * PARTS;
    if (CHUNKS % PARTS == 0 || chunk < CHUNKS)
      jm::joint_matrix_prefetch<ROWS, WIDTH>(
          sg, reinterpret_cast<const E*>(base + chunk * CHUNK), WIDTH, jm::layout::row_major,
          syclex::properties{syclex::prefetch_hint_L1});
  }
}

// acc[s] (M x N) += A_s (M x DEPTH) . B for A_s the s-th M-row strip of `a` from row `row0`:
// B read in the packed layout (row stride ldb words) from B_SPACE, SLM or global memory, one B
// tile per reduction step for all strips (matrix_mad_strips' form) ...
template <typename T, int M, int K, int N, int DEPTH, int STRIPS,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space, int TM,
          int TK, bool AL>
__attribute__((always_inline)) inline void matrix_mad_surface(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixSurface<T, TM, TK, AL>& a,
    int row0, const uint32_t* b, int ldb) {
  static_assert(STRIPS >= 2, "at least two tiles per array (see the overload below)");
  MatrixA<T, M, K> a_tile;
  MatrixB<T, K, N> b_tile;
#pragma unroll
  for (int k = 0; k < DEPTH; k += K) {
    jm::joint_matrix_load(
        sg, b_tile, matrix_ptr<B_SPACE>(reinterpret_cast<const T*>(b + k / 2 * ldb)), 2 * ldb);
#pragma unroll
    for (int s = 0; s < STRIPS; ++s) {
      matrix_load_a(sg, a_tile, a, row0 + s * M, k);
      jm::joint_matrix_mad(sg, acc[s], a_tile, b_tile, acc[s]);
    }
  }
}

// ... or B held in registers, the DEPTH / K operands b[].
template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int TM, int TK, bool AL>
__attribute__((always_inline)) inline void matrix_mad_surface(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixSurface<T, TM, TK, AL>& a,
    int row0, MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  // IGC (ocloc 26.27) drops a kernel whose elements it reaches in an array of one joint_matrix
  // (every store after it vanished); two or more are kept.
  static_assert(STRIPS >= 2 && DEPTH / K >= 2, "at least two tiles per array");
  MatrixA<T, M, K> a_tile;
#pragma unroll
  for (int k = 0; k < DEPTH; k += K) {
#pragma unroll
    for (int s = 0; s < STRIPS; ++s) {
      matrix_load_a(sg, a_tile, a, row0 + s * M, k);
      jm::joint_matrix_mad(sg, acc[s], a_tile, b[k / K], acc[s]);
    }
  }
}

// ... or one reduction step, B a single operand in registers: a lone joint_matrix, not an
// array of one.
template <typename T, int M, int K, int N, int STRIPS, int TM, int TK, bool AL>
__attribute__((always_inline)) inline void matrix_mad_surface_step(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixSurface<T, TM, TK, AL>& a,
    int row0, MatrixBRegisters<T, K, N>& b) {
  static_assert(STRIPS >= 2, "at least two tiles per array");
  MatrixA<T, M, K> a_tile;
#pragma unroll
  for (int s = 0; s < STRIPS; ++s) {
    matrix_load_a(sg, a_tile, a, row0 + s * M, 0);
    jm::joint_matrix_mad(sg, acc[s], a_tile, b, acc[s]);
  }
}

}  // namespace ipex_flash
