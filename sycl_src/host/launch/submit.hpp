// Submitting a compiled kernel with its params struct, and turning SYCL errors into
// exceptions that name the kernel and device.
#pragma once

#include <sycl/sycl.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "host/runtime/device_queue.hpp"

namespace ipex_flash {

// The steady clock (CLOCK_MONOTONIC, Python's time.perf_counter_ns) at the first kernel
// submission since take_first_submission_ns() last read it: how the host-cost benchmark times
// a call from Python up to its kernels' submission, apart from their execution.
inline std::atomic<int64_t> first_submission_ns{0};

inline int64_t take_first_submission_ns() { return first_submission_ns.exchange(0); }

// While set, kernels are timed as submitted but not run: the host-cost benchmark's way of
// timing a call's host path with the host's caches as a GPU leaves them (a GPU runs the
// kernels on its own memory; the CPU device's kernels run on the host's cores and evict it).
// Outputs are then left unwritten. Never set outside that measurement.
inline std::atomic<bool> kernels_skipped{false};

template <typename Params>
sycl::event submit_kernel(sycl::queue& queue, const sycl::kernel& kernel, const Params& params,
                          const sycl::nd_range<1>& range, const char* what) {
  int64_t unset = 0;
  first_submission_ns.compare_exchange_strong(
      unset, std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
                 .count());
  if (kernels_skipped.load(std::memory_order_relaxed)) return sycl::event();
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
