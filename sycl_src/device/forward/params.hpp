// The forward kernels' parameters.
// Shared verbatim by the host launchers (g++) and the device code (compiled at run time by the
// kernel compiler). Plain C++ only: no SYCL types here.
#pragma once

#include <cstdint>

#include "common/params.hpp"

namespace ipex_flash {

struct FwdParams {
  const void* q;         // (B, Hq, Nq, D), input dtype
  const void* k;         // (B, Hkv, Nk, D), or pages (P, Hkv, page_size, D)
  const void* v;         // like k
  void* out;             // (B, Hq, Nq, Dv), input dtype
  float* lse;            // natural-log log-sum-exp, float32, see LseStrides
  BhndStrides q_stride;
  BhndStrides k_stride;  // paged: batch = elements between pages
  BhndStrides v_stride;
  BhndStrides out_stride;
  AttentionCommon common;
  // Matrix-engine kernel only: K and V^T in tile order (forward/matrix_kernel.hpp), written by
  // its pack kernel (forward/pack_kv.hpp), BLOCK_N keys a block.
  void* kv_packed;
  PackRows kv_pack;
  MaskBitsParams mask_bits;  // the register kernel's bool mask (fwd_mask_bits), in the scratch
};

}  // namespace ipex_flash
