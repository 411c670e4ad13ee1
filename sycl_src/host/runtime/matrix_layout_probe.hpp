// Whether a device's matrix engine lays tiles out as the register-resident kernels assume
// (matrix/registers.hpp), checked by running probes/matrix_layout_probe_kernel.hpp once per
// process, device, dtype and tile shape. Where it does not (or the probe cannot run), those
// calls take the SLM-staged kernels, with one warning: a wrong layout would give wrong results,
// not errors.
#pragma once

#include <sycl/sycl.hpp>

#include "host/variants/device_limits.hpp"
#include "host/variants/kernel_variant.hpp"
#include "host/variants/skip_reasons.hpp"

namespace ipex_flash {

// True when `variant` does not keep its tiles in registers, or when the probe for its dtype and
// tile shape passes on the queue's device. IPEX_FLASH_TEST_LAYOUT_MISMATCH makes the probe
// expect another layout (the test seam for the fallback).
bool matrix_layout_verified(sycl::queue& queue, const KernelVariant& variant);

// The probe's program for `variant`'s dtype and tile shape (gpu-check compiles it too).
KernelProgram layout_probe_program(const KernelVariant& variant);

// The variant `choose(limits, why)` picks, or, where the queue's engine fails the layout probe
// for it, the one it picks with the register-resident kernels refused (SLM-staged; its reasons
// then say kLayoutRefused).
template <typename Choose>
KernelVariant layout_verified_variant(sycl::queue& queue, const DeviceLimits& limits,
                                      const Choose& choose, SkipReasons* why = nullptr) {
  SkipReasons reasons;
  const KernelVariant variant = choose(limits, why ? &reasons : nullptr);
  if (matrix_layout_verified(queue, variant)) {
    add_reasons(why, reasons);
    return variant;
  }
  DeviceLimits staged = limits;
  staged.matrix_layout_refused = true;
  return choose(staged, why);
}

}  // namespace ipex_flash
