// Host side of the KV-cache append (sycl_src/device/kv_append.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "device/common/params.hpp"
#include "device/kvcache/params.hpp"
#include "host/kernel_cache.hpp"
#include "host/variants.hpp"

namespace ipex_flash {

// The program appending elements of new_dtype (float32, float16, bfloat16, or an FP8
// cache's) into a cache of dtype for a device of these limits: copies, quantised when a 16-bit
// new_dtype meets an FP8 cache, or with rotary tables of dtype cos_dtype (float32 or dtype;
// "" for none) the rotary kernel.
KernelProgram kv_append_program(const std::string& dtype, const std::string& new_dtype,
                                const std::string& cos_dtype, const DeviceLimits& limits);

// Submits the append described by params (addresses, strides and sizes filled in; rotary
// when params.rotary.rotary_dim > 0; the descales when quantising) on the queue, after the work
// already on it; the caller's next launch on the queue runs after it.
void kv_append(const KvAppendParams& params, const std::string& dtype,
               const std::string& new_dtype, const std::string& cos_dtype,
               std::uintptr_t queue_handle);

}  // namespace ipex_flash
