#include "host/matrix_path.hpp"

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace ipex_flash {
namespace {

namespace syclex = sycl::ext::oneapi::experimental;
using syclex::matrix::matrix_type;

std::atomic<bool> cpu_amx{false};

// Does the device multiply (m x k) . (k x 16) tiles of `type` into float32 accumulators?
// Devices list either fixed shapes (GPUs) or maxima (AMX).
bool takes_tile(const sycl::device& device, matrix_type type, int m, int k) {
  if (!has_matrix_engine(device)) return false;
  for (const auto& combo : device.get_info<syclex::info::device::matrix_combinations>()) {
    if (combo.atype != type || combo.btype != type || combo.ctype != matrix_type::fp32)
      continue;
    const size_t um = static_cast<size_t>(m), uk = static_cast<size_t>(k);
    const bool fixed = combo.msize == um && combo.nsize == 16 && combo.ksize == uk;
    const bool bounded = combo.msize == 0 && combo.max_msize >= um && combo.max_nsize >= 16 &&
                         combo.max_ksize >= uk;
    if (fixed || bounded) return true;
  }
  return false;
}

}  // namespace

void set_cpu_matrix_engine(bool available) { cpu_amx.store(available); }

bool has_matrix_engine(const sycl::device& device) {
  return device.has(sycl::aspect::ext_intel_matrix) && (!device.is_cpu() || cpu_amx.load());
}

MatrixTile matrix_tile(const sycl::device& device, const std::string& dtype, int head_dim) {
  const char* env = std::getenv("IPEX_FLASH_MATRIX");
  const std::string mode = env != nullptr ? env : "auto";
  if (mode == "0") return {};
  if (mode != "auto" && mode != "" && mode != "1" && mode != "8" && mode != "16")
    throw std::invalid_argument("ipex_flash: IPEX_FLASH_MATRIX must be auto, 0, 1, 8 or 16, got '" +
                                mode + "'");
  matrix_type type;
  if (dtype == "bfloat16") type = matrix_type::bf16;
  else if (dtype == "float16") type = matrix_type::fp16;
  else return {};  // float32 stays exact on the vector units
  const bool forced = mode == "1" || mode == "8" || mode == "16";
  if (!forced && !device.is_cpu()) return {};  // not yet run on an Intel GPU: opt-in there
  const std::vector<int> heights = mode == "8"    ? std::vector<int>{8}
                                   : mode == "16" ? std::vector<int>{16}
                                                  : std::vector<int>{16, 8};  // tallest first
  for (int m : heights) {
    if (!takes_tile(device, type, m, 16)) continue;
    // Deeper steps halve the tile loads and multiplies where the engine takes them (AMX).
    const bool deep = head_dim % 32 == 0 && takes_tile(device, type, m, 32);
    return MatrixTile{m, deep ? 32 : 16};
  }
  if (forced)
    throw std::runtime_error("ipex_flash: IPEX_FLASH_MATRIX=" + mode + " but " +
                             device.get_info<sycl::info::device::name>() +
                             " has no matrix engine for " + dtype + " tiles of that shape");
  return {};
}

}  // namespace ipex_flash
