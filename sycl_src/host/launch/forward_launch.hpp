// Host side of the forward kernel: takes the variant its policy picks for the queue's device
// (variants/forward_variant.hpp), with the run-time fallbacks (build guard, layout probe),
// fills FwdParams and launches.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <string>

#include "host/launch/attention_options.hpp"
#include "host/launch/tensor_view.hpp"
#include "host/variants/kernel_variant.hpp"
#include "host/variants/skip_reasons.hpp"

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

// The variant fwd_variant picks for the queue's device, under IPEX_FLASH_MATRIX: the one
// launches run. Where the device's engine fails the tile-layout check, the SLM-staged kernel;
// where its compiler cannot build the matrix program, the vector kernel. why: as fwd_variant's,
// those fallbacks' included.
KernelVariant fwd_variant_on(sycl::queue& queue, const std::string& dtype, int head_dim,
                             int head_dim_v, int features, SkipReasons* why = nullptr);

// Builds (or loads from the disk cache) the forward variant for (dtype, head_dim).
KernelVariant warmup_fwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle);

}  // namespace ipex_flash
