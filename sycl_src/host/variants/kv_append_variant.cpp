#include "host/variants/kv_append_variant.hpp"

#include "host/launch/attention_options.hpp"

namespace ipex_flash {

namespace {

// The unsigned integer of an element's width: the append copies bits.
std::string element_bits(const std::string& dtype) {
  if (dtype == "float32") return "uint32_t";
  return kv_feature(dtype) != 0 ? "uint8_t" : "uint16_t";  // FP8, or 16-bit floats
}

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

}  // namespace ipex_flash
