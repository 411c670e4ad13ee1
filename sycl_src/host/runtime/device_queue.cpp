#include "host/runtime/device_queue.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "host/runtime/device_sources.hpp"

namespace ipex_flash {

sycl::queue& cpu_queue() {
  // A function-local static is initialised once even with concurrent callers. Never
  // destroyed: at exit the SYCL runtime may already be torn down before our statics are.
  static sycl::queue* queue = [] {
    try {
      // Asynchronous errors are rethrown from throw_asynchronous() into the caller, where
      // they become Python exceptions, instead of terminating the process.
      auto rethrow = [](sycl::exception_list errors) {
        for (const std::exception_ptr& error : errors) std::rethrow_exception(error);
      };
      return new sycl::queue{sycl::cpu_selector_v, rethrow, sycl::property::queue::in_order{}};
    } catch (const sycl::exception& e) {
      throw std::runtime_error(
          std::string("ipex_flash: no SYCL CPU device: ") + e.what() +
          "\nCPU tensors need the SYCL CPU device: pip install 'ipex_flash[cpu]' (Intel's "
          "OpenCL CPU runtime, with a SYCL runtime of 2026.0.x-2026.1.x, whose Unified Runtime "
          "has the OpenCL adapter; 2026.2 has Level Zero only). OCL_ICD_FILENAMES must name "
          "its libintelocl.so before the first SYCL call (ipex_flash sets it on import when "
          "it is unset).");
    }
  }();
  return *queue;
}

sycl::queue& queue_from_handle(std::uintptr_t queue_handle) {
  if (queue_handle == 0) return cpu_queue();
  return *reinterpret_cast<sycl::queue*>(queue_handle);
}

bool needs_host_sync(std::uintptr_t queue_handle) {
  return queue_handle == 0 || queue_from_handle(queue_handle).get_device().is_cpu();
}

std::string device_description(const sycl::device& device) {
  std::ostringstream out;
  out << device.get_info<sycl::info::device::name>() << " ("
      << device.get_platform().get_info<sycl::info::platform::name>() << ")";
  return out.str();
}

std::string program_record_key(const sycl::device& device, const std::string& program) {
  const char* target = std::getenv("CL_CONFIG_CPU_TARGET_ARCH");
  const std::string text = device_description(device) + "|" +
                           device.get_info<sycl::info::device::driver_version>() + "|" +
                           (target ? target : "") + "|" + program;
  char hex[40];
  std::snprintf(hex, sizeof(hex), "%016llx-%016llx",
                static_cast<unsigned long long>(fnv1a(text)),
                static_cast<unsigned long long>(device_sources_hash()));
  return hex;
}

}  // namespace ipex_flash
