// Kernels compiled at run time from the embedded device sources (sycl_ext_oneapi_kernel_compiler),
// once per (context, device, kernel) in a process. Across processes the SYCL persistent cache
// (SYCL_CACHE_PERSISTENT / SYCL_CACHE_DIR, set by the Python package) keeps the binaries.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ipex_flash {

// The kernels `kernel_names` (template instantiations such as
// "ipex_flash::flash_fwd_kernel<float, 64, 64, 64>") from the device header `header`, built
// together (one compiler run) for the queue's device. Thread-safe. Throws std::runtime_error
// carrying the compiler's message and build log when the build fails.
std::vector<sycl::kernel> get_kernels(sycl::queue& queue, const std::string& header,
                                      const std::vector<std::string>& kernel_names);

// Warm-up mode (python -m ipex_flash warmup): every kernel compiled from source is built a
// second time, from the IR just cached, so that the persistent cache also holds the device
// binary that later processes look up (see build_kernels). Costs ~0.5 s per compiled variant.
void set_warmup_mode(bool on);

struct KernelCacheStats {
  int64_t builds;  // kernels built in this process (each may have come from the disk cache)
  int64_t hits;    // requests served from the in-process cache
};
KernelCacheStats kernel_cache_stats();

}  // namespace ipex_flash
