// The dropout keep-mask as a tensor, for tests: the very decisions the attention kernels make.
#pragma once

#include <sycl/sycl.hpp>

#include "score/dropout.hpp"
#include "common/params.hpp"
#include "probes/params.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// keep[b, h, row, key] = 1 where dropout keeps the probability: the mask the attention
// kernels apply, for tests. One work-item per element.
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void dropout_mask_kernel(DropoutMaskParams p) {
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int64_t index = static_cast<int64_t>(item.get_global_id(0));
  const int64_t per_head = static_cast<int64_t>(p.dims.len_q) * p.dims.len_k;
  if (index >= per_head * p.dims.batch * p.dims.heads_q) return;
  const int64_t batch_head = index / per_head;
  const int64_t row = index % per_head / p.dims.len_k, key = index % p.dims.len_k;
  float factor[1];
  dropout_factors_for_rows(DropoutDraw{p.dropout, batch_head, 0, 0}, row, key, factor);
  p.keep[index] = factor[0] != 0.f ? 1 : 0;
}

}  // namespace ipex_flash
