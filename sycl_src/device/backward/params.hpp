// The backward kernels' parameters.
// Shared verbatim by the host launchers (g++) and the device code (compiled at run time by the
// kernel compiler). Plain C++ only: no SYCL types here.
#pragma once

#include <cstdint>

#include "common/params.hpp"

namespace ipex_flash {

// The backward pass: delta = rowsum(dO * O) (preprocess), then dK and dV (one work-group per
// K/V block, summing over the query heads that share it, so no atomics), then dQ (one
// work-group per Q block).
struct BwdParams {
  const void* q;         // (B, Hq, Nq, D), input dtype
  const void* k;         // (B, Hkv, Nk, D)
  const void* v;         // (B, Hkv, Nk, Dv)
  const void* out;       // (B, Hq, Nq, Dv): the forward's output
  const void* dout;      // (B, Hq, Nq, Dv): gradient of the loss w.r.t. out
  void* dq;              // (B, Hq, Nq, D), input dtype
  void* dk;              // (B, Hkv, Nk, D)
  void* dv;              // (B, Hkv, Nk, Dv)
  const float* lse;      // the forward's log-sum-exp, see LseStrides
  float* delta;          // rowsum(dO * O), float32 scratch laid out like lse
  BhndStrides q_stride;
  BhndStrides k_stride;
  BhndStrides v_stride;
  BhndStrides out_stride;
  BhndStrides dout_stride;
  BhndStrides dq_stride;
  BhndStrides dk_stride;
  BhndStrides dv_stride;
  AttentionCommon common;  // dropout: the forward's, so the same elements are dropped
  // Matrix-engine kernels only (backward/matrix_kernels.hpp): K, K^T, V and the packed Q and
  // dO tiles, written by the pack kernels (backward/pack_operands.hpp): blocks of BLOCK_N keys,
  // of BLOCK_M query rows.
  void* packed;
  PackRows key_pack;
  PackRows row_pack;
  MaskBitsParams mask_bits;  // the register kernels' bool mask (bwd_mask_bits), in the scratch
};

}  // namespace ipex_flash
