// Kernels compiled at run time from the embedded device sources (sycl_ext_oneapi_kernel_compiler),
// once per (context, device, kernel) in a process. Across processes the SYCL persistent cache
// (SYCL_CACHE_PERSISTENT / SYCL_CACHE_DIR, set by the Python package) keeps the binaries.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "host/variants/kernel_variant.hpp"

namespace ipex_flash {

// The kernels of `program` (template instantiations such as
// "ipex_flash::flash_fwd_kernel<float, 64, 64, 64, 0, 64>" from one device header), built together
// (one compiler run) for the queue's device, in the program's order. Thread-safe. Throws
// std::runtime_error carrying the compiler's message and build log when the build fails.
std::vector<sycl::kernel> get_kernels(sycl::queue& queue, const KernelProgram& program);

// Runs the kernel compiler's front end on `program` for the queue's device without building
// device code (no kernel cache): with SYCL_DUMP_IMAGES=1 in the environment the runtime writes
// the program's SPIR-V into the working directory, which gpu-check hands to Intel's offline
// compiler for GPUs this machine does not have. Returns the build log; throws like get_kernels.
std::string compile_to_spirv(sycl::queue& queue, const KernelProgram& program);

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
