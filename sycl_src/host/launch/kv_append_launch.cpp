#include "host/launch/kv_append_launch.hpp"

#include <algorithm>

#include "host/launch/attention_options.hpp"
#include "host/launch/submit.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/runtime/kernel_cache.hpp"
#include "host/variants/device_limits.hpp"
#include "host/variants/kv_append_variant.hpp"
#include "device/kvcache/params.hpp"

namespace ipex_flash {

namespace {

constexpr int kGroup = 64;

}  // namespace

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
