// Host side of the backward kernels (sycl_src/device/flash_bwd.hpp).
#pragma once

#include <cstdint>

#include "host/attention_common.hpp"
#include "host/tensor_view.hpp"
#include "host/variants.hpp"

namespace ipex_flash {

// Tensors of one backward call. q, dq laid out like the forward's q, out and dout like its out;
// k, dk like its k, v and dv like its v; lse and delta (float32 scratch) like its lse; scratch: uint8, at least
// bwd_scratch_bytes (the matrix kernels' packed operands; may be empty for the vector ones).
struct BwdTensors {
  TensorView q, k, v, out, dout, lse, dq, dk, dv, delta, scratch;
};

// dq, dk, dv of the forward with the same options (same dropout seed and offset). Paged KV
// caches are not differentiable.
void flash_bwd(const BwdTensors& tensors, const AttentionOptions& options,
               std::uintptr_t queue_handle);

// Bytes of scratch flash_bwd needs for this problem on this queue's device (0 on the vector
// kernels).
int64_t bwd_scratch_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options, std::uintptr_t queue_handle);

// The backward variant for a problem on a device with these limits under IPEX_FLASH_MATRIX
// mode `mode` (matrix_path.hpp), and the program holding its kernels (preprocess, dK/dV, dQ;
// the matrix variant adds its two packing kernels).
KernelVariant bwd_variant(const std::string& dtype, int head_dim, int features,
                          const DeviceLimits& limits, const std::string& mode);
KernelProgram bwd_program(const KernelVariant& variant);

// Builds (or loads from the disk cache) the backward kernels for (dtype, head_dim).
KernelVariant warmup_bwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle);

}  // namespace ipex_flash
