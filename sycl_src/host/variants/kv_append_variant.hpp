// The KV-cache append's variant: which kernel writes new tokens into a cache (a copy of their
// bits, FP8 quantisation of 16-bit tokens, or the rotary kernel) and the program holding it.
// launch/kv_append_launch.hpp runs it.
#pragma once

#include <string>

#include "host/variants/device_limits.hpp"
#include "host/variants/kernel_variant.hpp"

namespace ipex_flash {

// The program appending elements of new_dtype (float32, float16, bfloat16, or an FP8
// cache's) into a cache of dtype for a device of these limits: copies, quantised when a 16-bit
// new_dtype meets an FP8 cache, or with rotary tables of dtype cos_dtype (float32 or dtype;
// "" for none) the rotary kernel.
KernelProgram kv_append_program(const std::string& dtype, const std::string& new_dtype,
                                const std::string& cos_dtype, const DeviceLimits& limits);

}  // namespace ipex_flash
