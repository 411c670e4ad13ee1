// Sub-group matrix multiplies on tiles in shared local memory, through the joint_matrix
// extension: XMX systolic arrays on Intel GPUs, AMX tiles on Xeons that have them. Each call is
// made by all N work-items of a sub-group together.
//
// Shapes: M x N accumulators, K-deep steps along the reduction dimension (K = 16 or 32), with
// a sub-group of N lanes. N = 16 fits XMX on Xe-HPC/Xe2 (M <= 8, K = 16) and AMX (M <= 16,
// K <= 32); N = 8 fits XMX on DG2 and Arrow Lake-H, which take only sub-group 8 (M <= 8,
// K = 16). The host picks M, K and N from the device's matrix_combinations
// (host/variants/matrix_engine.cpp).
//
// With IPEX_FLASH_MATRIX_EMULATE (IPEX_FLASH_MATRIX=emulate, host/variants/matrix_engine.hpp) the
// same interface is implemented with plain sub-group arithmetic, so that the kernels built on it
// run, and are tested, on devices without a matrix engine. Only the accumulator's layout in
// registers and the order of the fp32 additions differ; what is read and written is the same.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "common/dtypes.hpp"
#include "matrix/surface.hpp"

namespace ipex_flash {

// The attention kernels' use of the tiles (forward/matrix_kernel.hpp,
// backward/matrix_kernels.hpp): a sub-group owns N query rows (the accumulator columns, N = the
// kernels' MATRIX_N), and each work-item works through its row's scores this many at a time,
// whatever N is.
constexpr int MATRIX_KEY_CHUNK = 16;  // scores per work-item in registers at once

// Accumulator tiles multiplied together (matrix_mad_strips) out of `tiles`: up to 4, which with
// their shared B tile and an A tile fit AMX's 8 tile registers.
constexpr int matrix_strips(int tiles) { return tiles % 4 == 0 ? 4 : tiles % 2 == 0 ? 2 : 1; }

template <typename T>
inline auto local_ptr(T* p) {
  return sycl::address_space_cast<sycl::access::address_space::local_space,
                                  sycl::access::decorated::no>(p);
}

// Operand layouts, in both implementations:
// A (M x DEPTH) row-major, row stride lda (elements); or, with A_TILED, a matrix of lda
// columns stored M x K tile by tile (SurfaceOrder, matrix/surface.hpp: the 8-wide engines'
// packs), each tile contiguous, A_s's tiles one after another.
// B operands are kept in the matrix engines' packed (VNNI) layout, the one both XMX and AMX
// read natively (any other layout is converted element by element on every load): element
// (k, n) of a (depth x N) matrix is the half of 32-bit word [k / 2][n] selected by k % 2
// (pack_pair, common/dtypes.hpp); row stride ldb (words).
// Accumulators (M x N, fp32) are loaded from and stored to SLM rows of stride ldc (floats).
//
// matrix_mad_strips: STRIPS products sharing one B: acc[s] (M x N) += A_s (M x DEPTH) . B,
// for A_s the s-th M-row strip of A, A in A_SPACE and B in B_SPACE (SLM by default, or global
// memory). On the engine, each B step is loaded once for all strips, and the strips'
// accumulators are independent, so consecutive multiplies do not wait on one another (a matrix
// multiply's latency is several times its issue interval: a single accumulator chain leaves the
// engine idle in between).

#ifndef IPEX_FLASH_MATRIX_EMULATE

namespace jm = sycl::ext::oneapi::experimental::matrix;

// The joint_matrix element type of a storage type. bfloat16 is stored by its bits
// (common/dtypes.hpp) and only reinterpreted here: the matrix engine reads the bits, no
// conversion code is generated.
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
template <typename T, int K, int N>
using MatrixB = jm::joint_matrix<sycl::sub_group, typename MatrixElement<T>::type, jm::use::b,
                                 K, N, jm::layout::ext_intel_packed>;
template <int M, int N>
using MatrixAcc = jm::joint_matrix<sycl::sub_group, float, jm::use::accumulator, M, N>;

// Accumulator fill, load and store, the operations the emulation replaces. Templated on the
// accumulator type: joint_matrix's sizes are size_t, which MatrixAcc<int M, int N> cannot deduce.
template <typename Acc>
inline void matrix_fill(sycl::sub_group sg, Acc& acc, float value) {
  jm::joint_matrix_fill(sg, acc, value);
}

template <typename Acc>
inline void matrix_load_acc(sycl::sub_group sg, Acc& acc, float* c, int ldc) {
  jm::joint_matrix_load(sg, acc, local_ptr(c), ldc, jm::layout::row_major);
}

template <typename Acc>
inline void matrix_store_acc(sycl::sub_group sg, Acc& acc, float* c, int ldc) {
  jm::joint_matrix_store(sg, acc, local_ptr(c), ldc, jm::layout::row_major);
}

template <typename T, int M, int K, int N, int DEPTH, int STRIPS,
          sycl::access::address_space A_SPACE = sycl::access::address_space::local_space,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space,
          int UNROLL = DEPTH / K, bool A_TILED = false>
__attribute__((always_inline)) inline void matrix_mad_strips(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const T* a, int64_t lda, const uint32_t* b,
    int ldb) {
  static_assert(DEPTH % K == 0, "whole reduction steps");
  using AOrder = SurfaceOrder<A_TILED ? M : 0, A_TILED ? K : 0>;
  const int cols = static_cast<int>(lda);  // A's row length: its pitch when row-major
  MatrixA<T, M, K> a_tile;
  MatrixB<T, K, N> b_tile;
#pragma unroll(UNROLL)
  for (int k = 0; k < DEPTH; k += K) {
    jm::joint_matrix_load(sg, b_tile,
                          matrix_ptr<B_SPACE>(reinterpret_cast<const T*>(b + k / 2 * ldb)),
                          2 * ldb);
#pragma unroll
    for (int s = 0; s < STRIPS; ++s) {
      jm::joint_matrix_load(sg, a_tile,
                            matrix_ptr<A_SPACE>(a + AOrder::offset(s * M, k, cols, cols)),
                            static_cast<size_t>(A_TILED ? K : lda));
      jm::joint_matrix_mad(sg, acc[s], a_tile, b_tile, acc[s]);
    }
  }
}

#else  // IPEX_FLASH_MATRIX_EMULATE

// Lane n of the sub-group (of N lanes) holds column n of the accumulator: its M floats. Lane
// n reads B's column n, so N only sets how many lanes (columns) there are.
template <int M, int N>
struct MatrixAcc {
  float column[M];
};

// A 16-bit element from its bits (a half of a packed B word).
template <typename T>
inline T from_bits(uint32_t bits) {
  static_assert(sizeof(T) == 2, "16-bit types only");
  return sycl::bit_cast<T>(static_cast<uint16_t>(bits));
}

template <int M, int N>
inline void matrix_fill(sycl::sub_group, MatrixAcc<M, N>& acc, float value) {
#pragma unroll
  for (int m = 0; m < M; ++m) acc.column[m] = value;
}

template <int M, int N>
inline void matrix_load_acc(sycl::sub_group sg, MatrixAcc<M, N>& acc, float* c, int ldc) {
  const int n = static_cast<int>(sg.get_local_id()[0]);
#pragma unroll
  for (int m = 0; m < M; ++m) acc.column[m] = c[m * ldc + n];
}

template <int M, int N>
inline void matrix_store_acc(sycl::sub_group sg, MatrixAcc<M, N>& acc, float* c, int ldc) {
  const int n = static_cast<int>(sg.get_local_id()[0]);
#pragma unroll
  for (int m = 0; m < M; ++m) c[m * ldc + n] = acc.column[m];
}

// The address spaces only say where the operands are; plain pointers reach both here. UNROLL
// is the engine's loop form (below), not this one's.
template <typename T, int M, int K, int N, int DEPTH, int STRIPS,
          sycl::access::address_space A_SPACE = sycl::access::address_space::local_space,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space,
          int UNROLL = DEPTH / K, bool A_TILED = false>
inline void matrix_mad_strips(sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const T* a,
                              int64_t lda, const uint32_t* b, int ldb) {
  static_assert(DEPTH % K == 0 && K % 2 == 0, "whole reduction steps of whole B words");
  using AOrder = SurfaceOrder<A_TILED ? M : 0, A_TILED ? K : 0>;
  const int cols = static_cast<int>(lda);  // A's row length: its pitch when row-major
  const int n = static_cast<int>(sg.get_local_id()[0]);
  // Strip by strip, each with its column in registers through the whole reduction, one B word
  // (two reduction steps) at a time. Only the M rows are unrolled: unrolling the strips and
  // the reduction too made the JIT build of a forward kernel several times longer.
#pragma unroll 1
  for (int s = 0; s < STRIPS; ++s) {
    float column[M];
#pragma unroll
    for (int m = 0; m < M; ++m) column[m] = acc[s].column[m];
    const T* a_strip = a + static_cast<int64_t>(s) * M * lda;
    for (int kw = 0; kw < DEPTH / 2; ++kw) {
      const uint32_t word = b[kw * ldb + n];
      const float b_even = to_float(from_bits<T>(word & 0xffffu));  // k = 2 kw
      const float b_odd = to_float(from_bits<T>(word >> 16));       // k = 2 kw + 1
#pragma unroll
      for (int m = 0; m < M; ++m) {
        // A (m, 2 kw) and (m, 2 kw + 1): adjacent in either order (K is even)
        const T* a_mk = a_strip + AOrder::offset(m, 2 * kw, cols, cols);
        column[m] += to_float(a_mk[0]) * b_even + to_float(a_mk[1]) * b_odd;
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) acc[s].column[m] = column[m];
  }
}

#endif  // IPEX_FLASH_MATRIX_EMULATE

// C (STRIPS * M x N, row-major in SLM with row stride ldc) = A . B, or += with ACCUMULATE:
// matrix_mad_strips with its accumulators read from (or zeroed) and written back to C.
// UNROLL: reduction steps per loop iteration on the engine (all of them by default).
// This and the engine's matrix_mad_strips are always inlined: a kernel module shares one
// instance among kernels of the same tile shape, which LLVM then did not always inline, and a
// kernel's code depended on its neighbours (a DG2 dQ kernel spilled in gpu-check's module, not
// when built alone: docs/gpus.md).
template <typename T, int M, int K, int N, int DEPTH, int STRIPS, bool ACCUMULATE,
          sycl::access::address_space A_SPACE = sycl::access::address_space::local_space,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space,
          int UNROLL = DEPTH / K, bool A_TILED = false>
__attribute__((always_inline)) inline void matrix_product_to_slm(
    sycl::sub_group sg, float* c, int ldc, const T* a, int64_t lda, const uint32_t* b, int ldb) {
  MatrixAcc<M, N> acc[STRIPS];
#pragma unroll
  for (int s = 0; s < STRIPS; ++s) {
    if constexpr (ACCUMULATE)
      matrix_load_acc(sg, acc[s], c + s * M * ldc, ldc);
    else
      matrix_fill(sg, acc[s], 0.f);
  }
  matrix_mad_strips<T, M, K, N, DEPTH, STRIPS, A_SPACE, B_SPACE, UNROLL, A_TILED>(sg, acc, a,
                                                                               lda, b, ldb);
#pragma unroll
  for (int s = 0; s < STRIPS; ++s) matrix_store_acc(sg, acc[s], c + s * M * ldc, ldc);
}

}  // namespace ipex_flash
