// Host side of the forward kernel: picks the compiled variant for a problem, fills
// FwdParams and launches.
#pragma once

#include <cstdint>

#include "host/attention_common.hpp"
#include "host/tensor_view.hpp"
#include "host/variants.hpp"

namespace ipex_flash {

// out = softmax(modified, masked q k^T * scale, with dropout) v, and lse = per-row
// log-sum-exp, on the queue named by queue_handle (0 = the SYCL CPU device). Layouts: see
// make_common; out is laid out like q, with v's head dim. scratch: a uint8 tensor of at least
// fwd_scratch_bytes(q, k, v, options) bytes on the same device (the matrix-engine kernel's
// packed copy of K and V), free to reuse once this launch has run.
void flash_fwd(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& out, const TensorView& lse, const TensorView& scratch,
               const AttentionOptions& options, std::uintptr_t queue_handle);

// The scratch bytes flash_fwd needs for this problem (0 on the vector kernel).
int64_t fwd_scratch_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options, std::uintptr_t queue_handle);

// The forward variant for a problem (head_dim: q's and k's, head_dim_v: v's, 0 for the same)
// on a device with these limits, under IPEX_FLASH_MATRIX mode `mode` (matrix_path.hpp), and
// the program holding its kernels. The kernels run at the larger of the two padded head dims,
// but for the register kernel, which compiles V's apart (KernelVariant::head_dim_v).
KernelVariant fwd_variant(const std::string& dtype, int head_dim, int head_dim_v, int features,
                          const DeviceLimits& limits, const std::string& mode);
KernelProgram fwd_program(const KernelVariant& variant);

// Builds (or loads from the disk cache) the forward variant for (dtype, head_dim).
KernelVariant warmup_fwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle);

}  // namespace ipex_flash
