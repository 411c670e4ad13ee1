// Which SYCL queue a call runs on: the process-wide CPU-device queue for CPU tensors, or
// the queue of a torch XPU stream, handed over as the integer torch exposes.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <string>

namespace ipex_flash {

// The SYCL CPU device's queue, created on first use (thread-safe).
sycl::queue& cpu_queue();

// queue_handle == 0: cpu_queue(); otherwise a sycl::queue* owned by torch
// (torch.xpu.current_stream().sycl_queue).
sycl::queue& queue_from_handle(std::uintptr_t queue_handle);

// Whether work on this queue must be waited for before returning to Python: work on the CPU
// device, whichever queue, reads and writes CPU tensors, which torch reads or frees as soon as
// the op returns; XPU work is ordered by the stream (and its allocator) instead.
bool needs_host_sync(std::uintptr_t queue_handle);

std::string device_description(const sycl::device& device);

// Names `program` (its header, kernels and options as one text) on this device, driver, CPU
// target and device source, as a file name: a record kept on disk beside the kernel cache (the
// build guard's verdicts, the build locks) holds for exactly these.
std::string program_record_key(const sycl::device& device, const std::string& program);

}  // namespace ipex_flash
