// Dropout configuration from Python's arguments, and the keep-mask launcher for tests.
#pragma once

#include <cstdint>

#include "host/launch/tensor_view.hpp"
#include "host/variants/kernel_variant.hpp"
#include "device/common/params.hpp"

namespace ipex_flash {

// p in [0, 1); seed and offset drawn by the caller from torch's generator.
DropoutParams make_dropout(double p, uint64_t seed, uint64_t offset);

// The program of the keep-mask kernel.
KernelProgram dropout_mask_program();

// keep (B, Hq, Nq, Nk) uint8, contiguous: 1 where the kernels keep the probability.
void dropout_mask(const TensorView& keep, const DropoutParams& dropout,
                  std::uintptr_t queue_handle);

}  // namespace ipex_flash
