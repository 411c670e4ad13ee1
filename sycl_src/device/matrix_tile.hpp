// Sub-group matrix multiplies on tiles in shared local memory, through the joint_matrix
// extension: XMX systolic arrays on Intel GPUs, AMX tiles on Xeons that have them. Each call is
// made by all 16 work-items of a sub-group together.
//
// Shapes: M x 16 accumulators, K-deep steps along the reduction dimension (K = 16 or 32). Those
// fit every Intel matrix engine that takes 16-wide tiles: XMX on Xe-HPC (M <= 8, K = 16) and
// AMX (M <= 16, K <= 32); the host picks M and K from the device's matrix_combinations.
#pragma once

#include <sycl/sycl.hpp>

#include "dtypes.hpp"

namespace ipex_flash {

namespace jm = sycl::ext::oneapi::experimental::matrix;

constexpr int MATRIX_N = 16;  // accumulator columns = sub-group size

// The joint_matrix element type of a storage type. bfloat16 is stored by its bits
// (dtypes.hpp) and only reinterpreted here: the matrix engine reads the bits, no conversion
// code is generated.
template <typename T>
struct MatrixElement;
template <>
struct MatrixElement<bfloat16_bits> {
  using type = sycl::ext::oneapi::bfloat16;
};
template <>
struct MatrixElement<sycl::half> {
  using type = sycl::half;
};

template <typename T>
inline auto local_ptr(T* p) {
  return sycl::address_space_cast<sycl::access::address_space::local_space,
                                  sycl::access::decorated::no>(p);
}

// A tile operand's address as joint_matrix_load takes it: in SLM, or (SPACE global_space) read
// straight from global memory (the decode kernel's K rows, the forward's packed K and V^T).
template <sycl::access::address_space SPACE = sycl::access::address_space::local_space,
          typename T>
inline auto matrix_ptr(const T* p) {
  using E = typename MatrixElement<T>::type;
  return sycl::address_space_cast<SPACE, sycl::access::decorated::no>(reinterpret_cast<const E*>(p));
}

template <typename T, int M, int K>
using MatrixA = jm::joint_matrix<sycl::sub_group, typename MatrixElement<T>::type, jm::use::a,
                                 M, K, jm::layout::row_major>;
template <typename T, int K>
using MatrixB = jm::joint_matrix<sycl::sub_group, typename MatrixElement<T>::type, jm::use::b,
                                 K, MATRIX_N, jm::layout::ext_intel_packed>;
template <int M>
using MatrixAcc = jm::joint_matrix<sycl::sub_group, float, jm::use::accumulator, M, MATRIX_N>;

// B operands are kept in the matrix engines' packed (VNNI) layout, the one both XMX and AMX
// read natively (any other layout is converted element by element on every load): element
// (k, n) of a (depth x N) matrix is the half of 32-bit word [k / 2][n] selected by k % 2
// (pack_pair, dtypes.hpp).
//
// STRIPS products sharing one B: acc[s] (M x 16) += A_s (M x DEPTH) . B, for A_s the s-th M-row
// strip of A, row-major with row stride lda (elements), in SLM or in A_SPACE; B (DEPTH x 16)
// packed as words b[k / 2][n] with row stride ldb (words), in SLM. Each B step is loaded once
// for all strips, and the strips' accumulators are independent, so consecutive multiplies do
// not wait on one another (a matrix multiply's latency is several times its issue interval: a
// single accumulator chain leaves the engine idle in between).
template <typename T, int M, int K, int DEPTH, int STRIPS,
          sycl::access::address_space A_SPACE = sycl::access::address_space::local_space>
inline void matrix_mad_strips(sycl::sub_group sg, MatrixAcc<M> (&acc)[STRIPS], const T* a,
                              int64_t lda, const uint32_t* b, int ldb) {
  static_assert(DEPTH % K == 0, "whole reduction steps");
  MatrixA<T, M, K> a_tile;
  MatrixB<T, K> b_tile;
#pragma unroll
  for (int k = 0; k < DEPTH; k += K) {
    jm::joint_matrix_load(sg, b_tile, matrix_ptr(reinterpret_cast<const T*>(b + k / 2 * ldb)),
                          2 * ldb);
#pragma unroll
    for (int s = 0; s < STRIPS; ++s) {
      jm::joint_matrix_load(sg, a_tile, matrix_ptr<A_SPACE>(a + s * M * lda + k),
                            static_cast<size_t>(lda));
      jm::joint_matrix_mad(sg, acc[s], a_tile, b_tile, acc[s]);
    }
  }
}

// C (STRIPS * M x 16, row-major in SLM with row stride ldc) = A . B, or += with ACCUMULATE:
// matrix_mad_strips with its accumulators read from (or zeroed) and written back to C.
template <typename T, int M, int K, int DEPTH, int STRIPS, bool ACCUMULATE,
          sycl::access::address_space A_SPACE = sycl::access::address_space::local_space>
inline void matrix_product_to_slm(sycl::sub_group sg, float* c, int ldc, const T* a,
                                  int64_t lda, const uint32_t* b, int ldb) {
  MatrixAcc<M> acc[STRIPS];
#pragma unroll
  for (int s = 0; s < STRIPS; ++s) {
    if constexpr (ACCUMULATE)
      jm::joint_matrix_load(sg, acc[s], local_ptr(c + s * M * ldc), ldc, jm::layout::row_major);
    else
      jm::joint_matrix_fill(sg, acc[s], 0.f);
  }
  matrix_mad_strips<T, M, K, DEPTH, STRIPS, A_SPACE>(sg, acc, a, lda, b, ldb);
#pragma unroll
  for (int s = 0; s < STRIPS; ++s)
    jm::joint_matrix_store(sg, acc[s], local_ptr(c + s * M * ldc), ldc, jm::layout::row_major);
}

}  // namespace ipex_flash
