#include "host/kv_append_launch.hpp"

#include "host/attention_common.hpp"
#include "host/device_limits.hpp"
#include "host/device_queue.hpp"
#include "host/launch.hpp"
#include "device/kvcache/params.hpp"

namespace ipex_flash {

namespace {

// The unsigned integer of an element's width: the append copies bits.
std::string element_bits(const std::string& dtype) {
  if (dtype == "float32") return "uint32_t";
  return kv_feature(dtype) != 0 ? "uint8_t" : "uint16_t";  // FP8, or 16-bit floats
}

constexpr int kGroup = 64;

}  // namespace

KernelProgram kv_append_program(const std::string& dtype, const std::string& new_dtype,
                                const std::string& cos_dtype, const DeviceLimits& limits) {
  KernelVariant variant{dtype, 0, 0, 0, 0};
  variant.cpu_device = limits.is_cpu;
  std::string kernel;
  if (!cos_dtype.empty())
    kernel = "ipex_flash::kv_append_rotary_kernel<" + device_type_name(dtype) + ", " +
             device_type_name(cos_dtype) + ">";
  else if (new_dtype != dtype && kv_feature(dtype) != 0)
    kernel = "ipex_flash::kv_append_kernel<ipex_flash::StoreFp8<" + device_type_name(new_dtype) +
             ", " + device_type_name(dtype) + ">>";
  else
    kernel = "ipex_flash::kv_append_kernel<ipex_flash::StoreBits<" + element_bits(dtype) + ">>";
  return {"programs/kv_append.hpp", {kernel}, program_options(variant)};
}

void kv_append(const KvAppendParams& params, const std::string& dtype,
               const std::string& new_dtype, const std::string& cos_dtype,
               std::uintptr_t queue_handle) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  const bool rotary = params.rotary.rotary_dim > 0;
  const sycl::kernel kernel = get_kernels(
      queue,
      kv_append_program(dtype, new_dtype, rotary ? cos_dtype : "",
                        device_limits(queue.get_device())))[0];
  const int64_t query_rows =
      rotary ? static_cast<int64_t>(params.batch) * params.len_q * params.heads_q : 0;
  const int64_t rows = std::max<int64_t>(
      params.batch,
      static_cast<int64_t>(params.batch) * params.new_tokens * params.heads + query_rows);
  submit_kernel(queue, kernel, params, block_range(1, (rows + kGroup - 1) / kGroup, kGroup),
                "kv_append");
}

}  // namespace ipex_flash
