// The backward's first kernel, shared by every backward program: delta = rowsum(dO * O), one
// work-item per query row, which the dQ and dK/dV kernels read for dS = P * (dP - delta).
#pragma once

#include <sycl/sycl.hpp>

#include "common/dtypes.hpp"
#include "common/params.hpp"
#include "backward/params.hpp"
#include "common/seq_info.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

template <typename T>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void flash_bwd_preprocess_kernel(BwdParams p) {
  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int64_t index = static_cast<int64_t>(item.get_global_id(0));  // (b, h, row) flattened
  if (index >= static_cast<int64_t>(c.dims.batch) * c.dims.heads_q * c.dims.len_q) return;
  const int64_t row = index % c.dims.len_q;
  const int64_t bh = index / c.dims.len_q;
  const int b = static_cast<int>(bh / c.dims.heads_q), h = static_cast<int>(bh % c.dims.heads_q);
  const SeqInfo seq = seq_info(c, b);
  if (row >= seq.len_q) return;
  const T* out = static_cast<const T*>(p.out) + b * p.out_stride.batch + h * p.out_stride.head +
                 (seq.q_row0 + row) * p.out_stride.row;
  const T* dout = static_cast<const T*>(p.dout) + b * p.dout_stride.batch +
                  h * p.dout_stride.head + (seq.q_row0 + row) * p.dout_stride.row;
  float sum = 0.f;
  for (int d = 0; d < c.dims.head_dim_v; ++d) sum += to_float(out[d]) * to_float(dout[d]);
  p.delta[lse_index(c, seq, b, h, row)] = sum;
}

}  // namespace ipex_flash
