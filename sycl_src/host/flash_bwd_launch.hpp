// Host side of the backward kernels (sycl_src/device/flash_bwd.hpp).
#pragma once

#include <cstdint>

#include "device/params.hpp"
#include "host/tensor_view.hpp"
#include "host/variants.hpp"

namespace ipex_flash {

// Tensors of one backward call. q, out, dout, dq: (B, Hq, Nq, D); k, v, dk, dv:
// (B, Hkv, Nk, D); lse and delta: (B, Hq, Nq) contiguous float32 (delta is scratch).
struct BwdTensors {
  TensorView q, k, v, out, dout, lse, dq, dk, dv, delta;
};

// dq, dk, dv of attention(q, k, v) given dout, from the forward's out and lse.
// dropout must be the forward's (same seed and offset).
void flash_bwd(const BwdTensors& tensors, float scale, const MaskParams& mask,
               const DropoutParams& dropout, std::uintptr_t queue_handle);

// Builds (or loads from the disk cache) the backward kernels for (dtype, head_dim).
KernelVariant warmup_bwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle);

}  // namespace ipex_flash
