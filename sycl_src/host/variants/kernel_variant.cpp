#include "host/variants/kernel_variant.hpp"

#include <algorithm>
#include <stdexcept>

namespace ipex_flash {
namespace {

constexpr int kMinBlock = 16;  // one sub-group of rows / two register chunks of keys

}  // namespace

int padded_head_dim(int head_dim) {
  const int step = head_dim <= 128 ? 16 : 32;
  return (head_dim + step - 1) / step * step;
}

std::string device_type_name(const std::string& dtype) {
  if (dtype == "float32") return "float";
  if (dtype == "float16") return "sycl::half";
  if (dtype == "bfloat16") return "ipex_flash::bfloat16_bits";
  if (dtype == "float8_e4m3fn") return "ipex_flash::float8_e4m3_bits";  // FP8 caches' elements
  if (dtype == "float8_e5m2") return "ipex_flash::float8_e5m2_bits";
  throw std::invalid_argument("ipex_flash: unsupported dtype " + dtype +
                              " (expected float32, float16 or bfloat16)");
}

std::string KernelVariant::instantiate(const std::string& kernel, bool matrix_args) const {
  return kernel + "<" + device_type_name(dtype) + ", " + std::to_string(head_dim) + ", " +
         std::to_string(block_m) + ", " + std::to_string(block_n) + ", " +
         std::to_string(features) +
         (matrix_args ? ", " + std::to_string(matrix_m) + ", " + std::to_string(matrix_k) +
                            ", " + std::to_string(matrix_n)
                      : std::string()) +
         ">";
}

std::string KernelVariant::tile_order(bool tiled) const {
  return ", " + std::to_string(tiled ? matrix_m : 0) + ", " + std::to_string(tiled ? matrix_k : 0);
}

std::string with_trailing(const std::string& name, const std::string& arguments) {
  return name.substr(0, name.size() - 1) + arguments + ">";
}

std::string with_trailing(const std::string& name, std::initializer_list<int> arguments) {
  std::string written;
  for (int argument : arguments) written += ", " + std::to_string(argument);
  return with_trailing(name, written);
}

std::vector<std::string> program_options(const KernelVariant& variant) {
  std::vector<std::string> options;
  if (variant.cpu_device) options.push_back("-DIPEX_FLASH_CPU_LOOPS");
  if (variant.large_grf) options.push_back("-DIPEX_FLASH_LARGE_GRF");
  // Only where the matrix kernels are built: the vector kernels would otherwise be built and
  // cached twice under two option strings.
  if (variant.matrix_emulated && variant.matrix_m > 0)
    options.push_back("-DIPEX_FLASH_MATRIX_EMULATE");
  return options;
}

KernelVariant base_variant(const std::string& dtype, int head_dim, const DeviceLimits& limits) {
  if (head_dim < 1 || head_dim > kMaxQkHeadDim)
    throw std::invalid_argument("ipex_flash: head dim must be in [1, " +
                                std::to_string(kMaxQkHeadDim) + "] (v's in [1, " +
                                std::to_string(kMaxHeadDim) + "]), got " +
                                std::to_string(head_dim));
  device_type_name(dtype);  // validates the dtype
  KernelVariant variant{dtype, padded_head_dim(head_dim), 64, 64};
  variant.cpu_device = limits.is_cpu;
  variant.large_grf = limits.large_grf && !limits.is_cpu;
  return variant;
}

int largest_fitting_head_dim(int head_dim, size_t local_bytes, const SlmBytes& slm_bytes,
                             const TileBounds& bounds) {
  // Compiled sizes downwards: multiples of 32 above 128, of 16 from there.
  for (int d = padded_head_dim(head_dim); d >= 16; d -= d > 128 ? 32 : 16)
    if (slm_bytes(d, bounds.min_block_m, kMinBlock) <= local_bytes) return d;
  return 0;
}

std::string no_fit_message(const std::string& kernel, int head_dim, const DeviceLimits& limits,
                           size_t needed, int fits) {
  const std::string device =
      limits.title.empty() ? limits.name : limits.name + " (" + limits.title + ")";
  const size_t kib = limits.local_mem_bytes / 1024;
  return "ipex_flash: no " + kernel + " for head dim " + std::to_string(head_dim) + " on " +
         device + ": its " + std::to_string(kib) + " KiB of local memory per work-group (" +
         std::to_string(limits.local_mem_bytes) + " bytes) " +
         (fits > 0 ? "fits head dims up to " + std::to_string(fits)
                   : std::string("fits no head dim")) +
         "; the smallest tiles need " + std::to_string(needed) + " bytes at head dim " +
         std::to_string(head_dim);
}

KernelVariant choose_variant(const std::string& dtype, int head_dim, const DeviceLimits& limits,
                             const SlmBytes& slm_bytes, const TileBounds& bounds) {
  KernelVariant variant = base_variant(dtype, head_dim, limits);
  variant.block_n = std::min(variant.block_n, bounds.max_block_n);
  const size_t slm_limit = limits.local_mem_bytes;
  const size_t wg_limit = limits.max_work_group;
  while (variant.block_m > bounds.min_block_m && static_cast<size_t>(variant.block_m) > wg_limit)
    variant.block_m /= 2;
  while (variant.block_n > kMinBlock && static_cast<size_t>(variant.block_n) > wg_limit)
    variant.block_n /= 2;
  // Shrink the K/V tile first: that costs only more barriers, while a smaller Q tile means
  // re-reading K and V more often.
  while (slm_bytes(variant.head_dim, variant.block_m, variant.block_n) > slm_limit) {
    if (variant.block_n > kMinBlock) variant.block_n /= 2;
    else if (variant.block_m > bounds.min_block_m) variant.block_m /= 2;
    else throw std::runtime_error(no_fit_message(
        bounds.kernel, head_dim, limits,
        slm_bytes(variant.head_dim, variant.block_m, variant.block_n),
        largest_fitting_head_dim(head_dim, slm_limit, slm_bytes, bounds)));
  }
  variant.slm_bytes = slm_bytes(variant.head_dim, variant.block_m, variant.block_n);
  return variant;
}

}  // namespace ipex_flash
