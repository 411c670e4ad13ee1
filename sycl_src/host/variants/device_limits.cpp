#include "host/variants/device_limits.hpp"

#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <stdexcept>

#include "host/runtime/device_queue.hpp"

namespace ipex_flash {
namespace {

namespace syclex = sycl::ext::oneapi::experimental;
using syclex::matrix::matrix_type;
using syclex::architecture;

std::atomic<bool> cpu_amx{false};

// A dimension of a matrix_combinations entry takes `size` when fixed to it, or when bounded
// (fixed size 0) by at least it.
bool dimension_takes(int fixed, int bound, int size) {
  return fixed == size || (fixed == 0 && bound >= size);
}

std::vector<MatrixShape> matrix_shapes_of(const sycl::device& device) {
  std::vector<MatrixShape> shapes;
  const bool usable = device.has(sycl::aspect::ext_intel_matrix) &&
                      (!device.is_cpu() || cpu_amx.load());
  if (!usable) return shapes;
  for (const auto& combo : device.get_info<syclex::info::device::matrix_combinations>()) {
    if (combo.atype != combo.btype || combo.ctype != matrix_type::fp32) continue;
    const char* dtype = combo.atype == matrix_type::bf16   ? "bfloat16"
                        : combo.atype == matrix_type::fp16 ? "float16"
                                                           : nullptr;
    if (dtype == nullptr) continue;
    shapes.push_back(MatrixShape{dtype, static_cast<int>(combo.msize),
                                 static_cast<int>(combo.nsize), static_cast<int>(combo.ksize),
                                 static_cast<int>(combo.max_msize),
                                 static_cast<int>(combo.max_nsize),
                                 static_cast<int>(combo.max_ksize)});
  }
  return shapes;
}

// PVC, BMG, Lunar Lake (Xe-HPC, Xe2): they have the 256-register mode, and their XMX takes the
// matrix kernels' shape (N = 16, sub-group 16), for which gpu-check's rules pass on every
// matrix variant (compile-verified, not run: README, "Intel GPUs").
bool is_xe_hpc_or_xe2(const sycl::device& device) {
  if (!device.is_gpu()) return false;
  try {
    const architecture arch = device.get_info<syclex::info::device::architecture>();
    return arch == architecture::intel_gpu_pvc || arch == architecture::intel_gpu_pvc_vg ||
           arch == architecture::intel_gpu_bmg_g21 || arch == architecture::intel_gpu_bmg_g31 ||
           arch == architecture::intel_gpu_lnl_m;
  } catch (const sycl::exception&) {
    return false;  // an architecture this runtime does not know
  }
}

// Arc A-series (DG2) and Arrow Lake-H: XMX with sub-group 8, N = 8, which the matrix kernels'
// 8-wide form takes; gpu-check's rules pass on every such variant (compile-verified, not run).
bool is_dg2_or_arl_h(const sycl::device& device) {
  if (!device.is_gpu()) return false;
  try {
    const architecture arch = device.get_info<syclex::info::device::architecture>();
    return arch == architecture::intel_gpu_dg2_g10 || arch == architecture::intel_gpu_dg2_g11 ||
           arch == architecture::intel_gpu_dg2_g12 || arch == architecture::intel_gpu_arl_h;
  } catch (const sycl::exception&) {
    return false;
  }
}

DeviceLimits limits_of(const sycl::device& device) {
  DeviceLimits limits;
  limits.name = device.get_info<sycl::info::device::name>();
  limits.is_cpu = device.is_cpu();
  limits.local_mem_bytes = device.get_info<sycl::info::device::local_mem_size>();
  limits.max_work_group = device.get_info<sycl::info::device::max_work_group_size>();
  for (size_t size : device.get_info<sycl::info::device::sub_group_sizes>())
    limits.sub_group_sizes.push_back(static_cast<int>(size));
  limits.compute_units = static_cast<int>(device.get_info<sycl::info::device::max_compute_units>());
  limits.matrix = matrix_shapes_of(device);
  // On by default where it has run (the CPU device's AMX) or where gpu-check verifies it.
  limits.matrix_by_default = !limits.matrix.empty() && (limits.is_cpu || is_xe_hpc_or_xe2(device) ||
                                                        is_dg2_or_arl_h(device));
  limits.large_grf = is_xe_hpc_or_xe2(device);
  limits.fp8_decode = limits.is_cpu || limits.large_grf;
  limits.matrix_masked_backward = !limits.is_cpu;
  limits.matrix_lane_columns = !limits.is_cpu;
  return limits;
}

// A GPU profile as the CPU device runs it: the GPU's tiles, shapes and loop forms, with only
// the matrix shapes the CPU's own engine also takes (none without AMX) and without the large
// register file (a GPU compiler option the CPU device rejects; it changes no result), but
// with the GPU's choice of kernel for FP8 caches.
DeviceLimits profile_on_cpu(const DeviceLimits& profile, const DeviceLimits& cpu) {
  DeviceLimits limits = profile;
  limits.large_grf = false;
  limits.matrix_masked_backward = cpu.matrix_masked_backward;  // the CPU's compiler builds it
  limits.matrix_lane_columns = cpu.matrix_lane_columns;        // and its engine runs it
  limits.matrix.clear();
  for (const MatrixShape& shape : profile.matrix) {
    const int m = shape.m > 0 ? shape.m : shape.max_m;
    if (cpu.takes_matrix_tile(shape.dtype, m, shape.n, shape.k)) limits.matrix.push_back(shape);
  }
  return limits;
}

struct LimitsCache {
  std::mutex mutex;
  // A process sees a device or two: a list (stable references) searched in order.
  std::list<std::pair<sycl::device, DeviceLimits>> own;
  std::string profile;       // set_device_profile
  DeviceLimits profile_cpu;  // that profile as the CPU device runs it

  const DeviceLimits& own_limits(const sycl::device& device) {  // with mutex held
    for (const auto& [known, limits] : own)
      if (known == device) return limits;
    return own.emplace_back(device, limits_of(device)).second;
  }
};

LimitsCache& limits_cache() {
  static LimitsCache* cache = new LimitsCache();  // never destroyed, like the queue
  return *cache;
}

}  // namespace

bool MatrixShape::takes(int tile_m, int tile_n, int tile_k) const {
  return dimension_takes(m, max_m, tile_m) && dimension_takes(n, max_n, tile_n) &&
         dimension_takes(k, max_k, tile_k);
}

bool DeviceLimits::takes_matrix_tile(const std::string& dtype, int m, int n, int k) const {
  return std::any_of(matrix.begin(), matrix.end(), [&](const MatrixShape& shape) {
    return shape.dtype == dtype && shape.takes(m, n, k);
  });
}

bool DeviceLimits::takes_sub_group(int size) const {
  return std::find(sub_group_sizes.begin(), sub_group_sizes.end(), size) !=
         sub_group_sizes.end();
}

const DeviceLimits& device_limits(const sycl::device& device) {
  LimitsCache& cache = limits_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (device.is_cpu() && !cache.profile.empty()) return cache.profile_cpu;
  return cache.own_limits(device);
}

void set_device_profile(const std::string& name) {
  LimitsCache& cache = limits_cache();
  DeviceLimits profile = name.empty() ? DeviceLimits{} : profile_limits(name);
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.profile = name;
  if (!name.empty())
    cache.profile_cpu = profile_on_cpu(profile, cache.own_limits(cpu_queue().get_device()));
}

void set_cpu_matrix_engine(bool available) { cpu_amx.store(available); }

}  // namespace ipex_flash
