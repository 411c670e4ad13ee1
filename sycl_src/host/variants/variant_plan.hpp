// What a kernel family builds for a problem on a device, without building or running anything:
// the variant its policy picks, the program holding its kernels, and why it passed over each
// faster form. Read through C.plan by gpu-check, python -m ipex_flash plan and the tests.
#pragma once

#include <string>

#include "host/variants/device_limits.hpp"
#include "host/variants/kernel_variant.hpp"
#include "host/variants/skip_reasons.hpp"

namespace ipex_flash {

struct VariantPlan {
  KernelVariant variant;
  KernelProgram program;
  SkipReasons reasons;  // (skip_reasons.hpp)
};

// The plan of one kernel family for a problem on a device with these limits, under
// IPEX_FLASH_MATRIX mode `mode`: "forward" (head_dim_v: v's head dim where it differs, 0 for
// the same), "backward", "decode" (rows = query rows per K/V head, a (B, N, H, D) cache),
// "dropout_mask", "cache_check" or "kv_append" (mode "rotary": with the rotary embedding,
// tables in the dtype; "quantise": bfloat16 keys and values into an FP8 cache of dtype).
// Throws std::invalid_argument for an unknown family.
VariantPlan plan_variant(const std::string& family, const DeviceLimits& limits,
                         const std::string& dtype, int head_dim, int features, int rows,
                         const std::string& mode, int head_dim_v);

}  // namespace ipex_flash
