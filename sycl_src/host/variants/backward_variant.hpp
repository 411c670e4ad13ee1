// The backward's variant policy: for a problem on a device, which kernels (the vector units',
// the matrix engine's with tiles staged through local memory, or with dQ's and dK/dV's tiles in
// registers), at which tile sizes; and the program holding them. The launcher
// (launch/backward_launch.hpp) runs what this picks.
#pragma once

#include <string>

#include "host/variants/device_limits.hpp"
#include "host/variants/kernel_variant.hpp"
#include "host/variants/skip_reasons.hpp"

namespace ipex_flash {

// The backward variant for a problem on a device with these limits under IPEX_FLASH_MATRIX
// mode `mode` (matrix_engine.hpp). why: the reason for each faster form it passes over
// (skip_reasons.hpp).
KernelVariant bwd_variant(const std::string& dtype, int head_dim, int features,
                          const DeviceLimits& limits, const std::string& mode,
                          SkipReasons* why = nullptr);

// The program holding its kernels, in this order: preprocess, dK/dV, dQ; the matrix variant's
// preprocess, pack keys, pack rows, dK/dV, dQ.
KernelProgram bwd_program(const KernelVariant& variant);

// Whether the backward packs a bool attn_mask into bits (score/mask_bits_kernel.hpp) for its
// register kernels, which read it so: the program's sixth kernel.
bool bwd_mask_bits(const KernelVariant& variant);

// Sub-groups per MATRIX_N query rows of the register dQ kernel, and per MATRIX_N keys of the
// register dK/dV kernel, each holding a share of the resident accumulators' head dims (their
// SHARES template argument; the launch sizes follow): two on the 8-wide engines, whose 128
// registers of 32 bytes a whole dQ^T overflows from d = 32 and dK^T (or dV^T) past d = 32,
// even with two passes over the rows, one resident at a time (it would spill on DG2: gpu-check's
// record, docs/gpus.md), else one.
struct BwdShares {
  int dq, dkdv;
};

BwdShares bwd_shares(const KernelVariant& variant);

}  // namespace ipex_flash
