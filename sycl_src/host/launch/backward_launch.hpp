// Host side of the backward kernels (programs/flash_bwd*.hpp): takes the variant its policy
// picks for the queue's device (variants/backward_variant.hpp), with the run-time fallbacks
// (build guard, layout probe), fills BwdParams and launches.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <string>

#include "host/launch/attention_options.hpp"
#include "host/launch/tensor_view.hpp"
#include "host/variants/kernel_variant.hpp"
#include "host/variants/skip_reasons.hpp"

namespace ipex_flash {

// Tensors of one backward call. q, dq laid out like the forward's q, out and dout like its out;
// k, dk like its k, v and dv like its v; lse and delta (float32 scratch) like its lse; scratch:
// uint8, at least bwd_scratch_bytes (the matrix kernels' packed operands; may be empty for the
// vector ones).
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

// The variant bwd_variant picks for the queue's device, under IPEX_FLASH_MATRIX: the one
// launches run. Where the device's engine fails the tile-layout check, the SLM-staged kernels;
// where its compiler cannot build the matrix program, the vector kernels. why: as
// bwd_variant's, those fallbacks' included.
KernelVariant bwd_variant_on(sycl::queue& queue, const std::string& dtype, int head_dim,
                             int features, SkipReasons* why = nullptr);

// Builds (or loads from the disk cache) the backward kernels for (dtype, head_dim).
KernelVariant warmup_bwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle);

}  // namespace ipex_flash
