// Host side of the KV-cache append (programs/kv_append.hpp): its program
// (variants/kv_append_variant.hpp) launched over the new tokens' rows.
#pragma once

#include <cstdint>
#include <string>

#include "device/common/params.hpp"
#include "device/kvcache/params.hpp"

namespace ipex_flash {

// Submits the append described by params (addresses, strides and sizes filled in; rotary
// when params.rotary.rotary_dim > 0; the descales when quantising) on the queue, after the work
// already on it; the caller's next launch on the queue runs after it.
void kv_append(const KvAppendParams& params, const std::string& dtype,
               const std::string& new_dtype, const std::string& cos_dtype,
               std::uintptr_t queue_handle);

}  // namespace ipex_flash
