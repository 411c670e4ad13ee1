// The forward's variant policy: for a problem on a device, which kernel (the vector units', the
// matrix engine's with tiles staged through local memory, or with its tiles in registers), at
// which tile sizes; and the program (device header, kernel names, build options) holding it.
// The launcher (launch/forward_launch.hpp) runs what this picks.
#pragma once

#include <string>

#include "host/variants/device_limits.hpp"
#include "host/variants/kernel_variant.hpp"
#include "host/variants/skip_reasons.hpp"

namespace ipex_flash {

// The forward variant for a problem (head_dim: q's and k's, head_dim_v: v's, 0 for the same)
// on a device with these limits, under IPEX_FLASH_MATRIX mode `mode` (matrix_engine.hpp). The
// kernels run at the larger of the two padded head dims, but for the register kernel, which
// compiles V's apart (KernelVariant::head_dim_v). why: the reason for each faster form it
// passes over (skip_reasons.hpp).
KernelVariant fwd_variant(const std::string& dtype, int head_dim, int head_dim_v, int features,
                          const DeviceLimits& limits, const std::string& mode,
                          SkipReasons* why = nullptr);

// The program holding the variant's kernels: the attention kernel, and for the matrix engine
// the K/V pack kernel (forward/pack_kv.hpp) after it.
KernelProgram fwd_program(const KernelVariant& variant);

// Whether the forward packs a bool attn_mask into bits (score/mask_bits_kernel.hpp) for its
// register kernel; the program's third kernel packs them.
bool fwd_mask_bits(const KernelVariant& variant);

}  // namespace ipex_flash
