// Submitting a compiled kernel with its params struct, and turning SYCL errors into
// exceptions that name the kernel and device.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "host/device_queue.hpp"

namespace ipex_flash {

template <typename Params>
sycl::event submit_kernel(sycl::queue& queue, const sycl::kernel& kernel, const Params& params,
                          const sycl::nd_range<1>& range, const char* what) {
  try {
    return queue.submit([&](sycl::handler& h) {
      h.set_args(params);
      h.parallel_for(range, kernel);
    });
  } catch (const sycl::exception& e) {
    throw std::runtime_error(std::string("ipex_flash: launching ") + what + " on " +
                             device_description(queue.get_device()) + " failed: " + e.what());
  }
}

// CPU tensors are read by torch as soon as the op returns: wait, and surface any
// asynchronous error. XPU work stays ordered on torch's stream instead.
inline void finish_launch(sycl::queue& queue, std::uintptr_t queue_handle, sycl::event last,
                          const char* what) {
  if (!needs_host_sync(queue_handle)) return;
  try {
    last.wait();
    queue.throw_asynchronous();
  } catch (const sycl::exception& e) {
    throw std::runtime_error(std::string("ipex_flash: ") + what + " failed on " +
                             device_description(queue.get_device()) + ": " + e.what());
  }
}

}  // namespace ipex_flash
