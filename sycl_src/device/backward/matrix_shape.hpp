// The matrix backward's tile-shape rules, shared by its SLM-staged kernels
// (backward/matrix_kernels.hpp) and its register kernels (backward/dq_registers_kernel.hpp,
// backward/dkdv_registers_kernel.hpp).
#pragma once

#include "matrix/slm_tile.hpp"

namespace ipex_flash {

// Whether a variant's tiles divide its blocks and head dim for every product of the backward.
template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int MATRIX_M, int MATRIX_K, int MATRIX_N>
constexpr bool bwd_matrix_shape() {
  return BLOCK_M % MATRIX_N == 0 && BLOCK_M % MATRIX_K == 0 &&
         BLOCK_N % MATRIX_M == 0 && BLOCK_N % MATRIX_K == 0 && BLOCK_N % MATRIX_KEY_CHUNK == 0 &&
         HEAD_DIM % MATRIX_K == 0 && HEAD_DIM % MATRIX_M == 0 && HEAD_DIM % MATRIX_N == 0;
}

// Reduction steps per loop iteration of the backward's products. N = 8 (DG2, Arrow Lake-H: 128
// registers of 32 bytes, a quarter of the N = 16 GPUs' large register file): one. Fully
// unrolled there, IGC hoisted the dK/dV kernel's K and V tile loads (invariant across its query
// loop) out of that loop and spilled at d = 64-128, as did the dQ kernel with score changes;
// rolled, neither spills (gpu-check's record). The forward keeps full unrolling: it has no spill
// that way, and did spill rolled two steps deep (d = 64).
template <int MATRIX_N, int DEPTH, int MATRIX_K>
constexpr int bwd_unroll() { return MATRIX_N == 8 ? 1 : DEPTH / MATRIX_K; }

}  // namespace ipex_flash
