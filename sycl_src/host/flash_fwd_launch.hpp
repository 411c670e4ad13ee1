// Host side of the forward kernel: picks the compiled variant and tile sizes for a problem,
// fills FwdParams and launches.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <string>

#include "device/params.hpp"
#include "host/tensor_view.hpp"

namespace ipex_flash {

// A compiled variant of flash_fwd_kernel: everything fixed at kernel build time.
struct FwdVariant {
  std::string dtype;  // "float32", "float16", "bfloat16"
  int head_dim;       // padded head dim the kernel is compiled for (>= the problem's D)
  int block_m;        // query rows per work-group
  int block_n;        // keys per K/V block in SLM

  std::string kernel_name() const;
};

// The variant serving head dim `head_dim` on `device`: head dim rounded up to a supported
// size, tiles as large as the device's local memory allows.
FwdVariant choose_fwd_variant(const std::string& dtype, int head_dim, const sycl::device& device);

// out = softmax(q k^T * scale, masked) v, and lse = per-row log-sum-exp, on the queue named by
// queue_handle (0 = the SYCL CPU device). Shapes: q, out (B, Hq, Nq, D); k, v (B, Hkv, Nk, D);
// lse (B, Hq, Nq) contiguous float32.
void flash_fwd(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& out, const TensorView& lse, float scale,
               const MaskParams& mask, std::uintptr_t queue_handle);

// Builds (or loads from the disk cache) the variant for (dtype, head_dim) without running it.
FwdVariant warmup_fwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle);

}  // namespace ipex_flash
