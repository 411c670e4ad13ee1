// Host side of the on-device check of a KV cache's values (probes/cache_check_kernel.hpp).
#pragma once

#include <cstdint>

#include "host/launch/tensor_view.hpp"
#include "host/runtime/kernel_cache.hpp"
#include "host/variants/kernel_variant.hpp"
#include "device/common/params.hpp"
#include "device/probes/params.hpp"

namespace ipex_flash {

// The output (B, H, N, D) or LSE (B, H, N) view at `address` (0: none) as the check fills it.
FillView nan_fill_view(const TensorView& view, std::uintptr_t address);

KernelProgram cache_check_program(const DeviceLimits& limits);

// Submits the check of params' values (params.error is filled in: the word of the queue's
// context) on the queue, after the work already on it.
void check_cache_values(CacheCheckParams params, std::uintptr_t queue_handle);

// What read_cache_values found: CacheCheckError bits, and the most keys a sequence attends to.
struct CacheValues {
  uint32_t bits;
  int64_t most_keys;
};

// Runs the check on the queue before the attention and waits for it: one read of the device
// (params.error and params.report are filled in).
CacheValues read_cache_values(CacheCheckParams params, std::uintptr_t queue_handle);

// How many reads read_cache_values has made in this process (tests count the host's waits).
int64_t cache_value_reads();

// Raises std::invalid_argument (Python's ValueError) naming the arguments that an earlier
// check on this queue's context found out of range, and clears the record: the next call
// after the one that had them reports them.
void raise_cache_check_errors(std::uintptr_t queue_handle);

}  // namespace ipex_flash
