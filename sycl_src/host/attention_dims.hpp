// Problem sizes of (q, k) as the kernels' AttentionDims, checked.
#pragma once

#include <sycl/sycl.hpp>

#include <stdexcept>

#include "device/params.hpp"
#include "host/tensor_view.hpp"

namespace ipex_flash {

inline AttentionDims attention_dims(const TensorView& q, const TensorView& k) {
  const int64_t heads_q = q.size(1), heads_kv = k.size(1);
  if (heads_kv <= 0 || heads_q % heads_kv != 0)
    throw std::invalid_argument("ipex_flash: query heads must be a multiple of key/value heads");
  return AttentionDims{static_cast<int32_t>(q.size(0)), static_cast<int32_t>(heads_q),
                       static_cast<int32_t>(heads_q / heads_kv), static_cast<int32_t>(q.size(2)),
                       static_cast<int32_t>(k.size(2)), static_cast<int32_t>(q.size(3))};
}

// Work-groups of a launch: `blocks` per (batch, head), each `group_size` work-items.
inline sycl::nd_range<1> block_range(int64_t batch_heads, int64_t blocks, int group_size) {
  return sycl::nd_range<1>{static_cast<size_t>(batch_heads * blocks * group_size),
                           static_cast<size_t>(group_size)};
}

constexpr double kLog2e = 1.4426950408889634;

}  // namespace ipex_flash
