#include "host/variants/variant_plan.hpp"

#include <stdexcept>

#include "host/launch/cache_check_launch.hpp"
#include "host/launch/dropout_launch.hpp"
#include "host/variants/backward_variant.hpp"
#include "host/variants/decode_variant.hpp"
#include "host/variants/forward_variant.hpp"
#include "host/variants/kv_append_variant.hpp"
#include "device/probes/params.hpp"

namespace ipex_flash {

VariantPlan plan_variant(const std::string& family, const DeviceLimits& limits,
                         const std::string& dtype, int head_dim, int features, int rows,
                         const std::string& mode, int head_dim_v) {
  VariantPlan plan{KernelVariant{dtype, 0, 0, 0, features}, {}, {}};
  KernelVariant& variant = plan.variant;
  if (family == "forward") {
    variant = fwd_variant(dtype, head_dim, head_dim_v, features, limits, mode, &plan.reasons);
    plan.program = fwd_program(variant);
  } else if (family == "backward") {
    variant = bwd_variant(dtype, head_dim, features, limits, mode, &plan.reasons);
    plan.program = bwd_program(variant);
  } else if (family == "decode") {
    variant = decode_variant(dtype, head_dim, rows, features, /*heads_interleaved=*/true, limits,
                             mode, &plan.reasons, head_dim_v);
    plan.program = decode_program(variant);
  } else if (family == "dropout_mask") {
    plan.program = dropout_mask_program();
    variant.cpu_device = limits.is_cpu;
    plan.program.options = program_options(variant);
  } else if (family == "cache_check") {  // (the KV-cache values' check, cache_check_launch.hpp)
    plan.program = cache_check_program(limits);
    variant.slm_bytes = kCacheCheckLocalBytes;
  } else if (family == "kv_append") {
    plan.program = kv_append_program(dtype, mode == "quantise" ? "bfloat16" : dtype,
                                     mode == "rotary" ? dtype : "", limits);
  } else {
    throw std::invalid_argument("ipex_flash: unknown kernel family '" + family + "'");
  }
  return plan;
}

}  // namespace ipex_flash
