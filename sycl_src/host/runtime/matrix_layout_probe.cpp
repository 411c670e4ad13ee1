#include "host/runtime/matrix_layout_probe.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "host/launch/submit.hpp"
#include "host/launch/tensor_view.hpp"
#include "host/runtime/build_guard.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/runtime/kernel_cache.hpp"

namespace ipex_flash {
namespace {

struct LayoutProbeParams {  // as probes/matrix_layout_probe_kernel.hpp's
  void* a;
  uint32_t* verdict;
};

bool mismatch_seam() {
  static const bool seam = [] {
    const char* env = std::getenv("IPEX_FLASH_TEST_LAYOUT_MISMATCH");
    return env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0;
  }();
  return seam;
}

}  // namespace

KernelProgram layout_probe_program(const KernelVariant& variant) {
  std::vector<std::string> options = program_options(variant);
  if (mismatch_seam()) options.push_back("-DIPEX_FLASH_TEST_LAYOUT_MISMATCH");
  return {"programs/matrix_layout_probe.hpp",
          {"ipex_flash::matrix_layout_probe_kernel<" + device_type_name(variant.dtype) + ", " +
           std::to_string(variant.matrix_m) + ", " + std::to_string(variant.matrix_k) + ", " +
           std::to_string(variant.matrix_n) + ">"},
          options};
}

namespace {

bool run_probe(sycl::queue& queue, const KernelVariant& variant, std::string& why) {
  const KernelProgram program = layout_probe_program(variant);
  if (!program_builds(queue, program, variant)) {
    why = "its build failed";
    return false;
  }
  const int m = variant.matrix_m, k = variant.matrix_k, n = variant.matrix_n;
  std::vector<uint32_t> verdict(n, 0);
  void* a_device = nullptr;
  uint32_t* verdict_device = nullptr;
  try {
    const sycl::kernel kernel = get_kernels(queue, program)[0];
    a_device = sycl::malloc_device(4 * m * k * sizeof(uint16_t), queue);  // the probe writes it
    verdict_device = sycl::malloc_device<uint32_t>(n, queue);
    submit_kernel(queue, kernel, LayoutProbeParams{a_device, verdict_device},
                  sycl::nd_range<1>(n, n), "the matrix layout probe")
        .wait_and_throw();
    queue.memcpy(verdict.data(), verdict_device, n * sizeof(uint32_t)).wait();
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (a_device != nullptr) sycl::free(a_device, queue);
  if (verdict_device != nullptr) sycl::free(verdict_device, queue);
  if (!why.empty()) return false;
  for (uint32_t lane : verdict)
    if (lane != 1u) {
      why = "its tiles are laid out otherwise";
      return false;
    }
  return true;
}

}  // namespace

bool matrix_layout_verified(sycl::queue& queue, const KernelVariant& variant) {
  if (!variant.matrix_registers || variant.matrix_m == 0) return true;
  // A lookup per call: the device, dtype and tile shape.
  using Key = std::tuple<size_t, std::string, int, int, int, bool>;
  static std::mutex mutex;
  static std::map<Key, bool>* known = new std::map<Key, bool>();  // never destroyed
  const sycl::device device = queue.get_device();
  const Key key{std::hash<sycl::device>{}(device), variant.dtype, variant.matrix_m,
                variant.matrix_k, variant.matrix_n, variant.matrix_emulated};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = known->find(key);
    if (found != known->end()) return found->second;
  }
  // Run without the lock: the probe's build may warn, which takes the GIL, and a caller waiting
  // on the lock may hold it. Concurrent first calls may both run it; the first verdict stays,
  // and only its thread warns.
  std::string why;
  const bool verified = run_probe(queue, variant, why);
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto [entry, inserted] = known->emplace(key, verified);
    if (!inserted || entry->second) return entry->second;
  }
  // The reason the policies give for it (kLayoutRefused, in python -m ipex_flash plan too).
  guard_warn("ipex_flash: on " + device_description(device) + ", " + kLayoutRefused + " (" +
             why + ", " + variant.dtype +
             " tiles); these calls run the kernels that stage tiles through local memory.");
  return false;
}

}  // namespace ipex_flash
