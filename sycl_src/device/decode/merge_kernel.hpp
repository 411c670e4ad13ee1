// The second kernel of a decode call (decode/kernel.hpp): each split of the keys wrote a
// normalised partial output and its log-sum-exp; this combines them, with the head's sink (if
// any) as one more term of the denominator. LSEs are in the exp2 domain, as the kernels keep
// them (OnlineSoftmaxRow::log2_sum_exp).
#pragma once

#include <sycl/sycl.hpp>

#include "common/dtypes.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "decode/params.hpp"
#include "common/seq_info.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// A row's LSE over its splits and sink (exp2 domain), and one split's share of it: what the
// decode kernel writes itself when it runs one split.
struct SplitShare {
  float share, lse;
};

inline SplitShare split_share(const float* sinks, int h, float split_lse) {
  const float sink = sinks != nullptr ? sinks[h] * LOG2E : NEG_INF;
  const float most = sycl::fmax(sink, split_lse);
  const float safe_max = most == NEG_INF ? 0.f : most;  // no key and no sink: weights 0
  const float weight = sycl::exp2(split_lse - safe_max);
  const float total = sycl::exp2(sink - safe_max) + weight;
  return total > 0.f ? SplitShare{weight / total, safe_max + sycl::log2(total)}
                     : SplitShare{0.f, NEG_INF};
}

// Combines the splits of flash_decode_kernel: one work-item per (batch, head, query row).
template <typename T>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void flash_decode_merge_kernel(DecodeParams p) {
  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int64_t row = static_cast<int64_t>(item.get_global_id(0));  // (b, h, token)
  if (row >= static_cast<int64_t>(c.dims.batch) * c.dims.heads_q * c.dims.len_q) return;
  const int token = static_cast<int>(row % c.dims.len_q);
  const int64_t bh = row / c.dims.len_q;
  const int b = static_cast<int>(bh / c.dims.heads_q), h = static_cast<int>(bh % c.dims.heads_q);
  const SeqInfo seq = bounded_seq_info(c, p.bounds, b);
  const int splits = c.num_blocks;
  const float* lse_s = p.partial_lse + row * splits;
  // A sink joins the denominator as one more split with no value.
  const float sink = c.score_mod.sinks != nullptr ? c.score_mod.sinks[h] * LOG2E : NEG_INF;
  float max_lse = sink;
  for (int s = 0; s < splits; ++s) max_lse = sycl::fmax(max_lse, lse_s[s]);
  const float safe_max = max_lse == NEG_INF ? 0.f : max_lse;  // all splits empty: weights 0
  float total = sycl::exp2(sink - safe_max);
  for (int s = 0; s < splits; ++s) total += sycl::exp2(lse_s[s] - safe_max);
  const float inv_total = total > 0.f ? 1.f / total : 0.f;
  T* out = static_cast<T*>(p.out) + b * p.out_stride.batch + h * p.out_stride.head +
           token * p.out_stride.row;
  for (int d = 0; d < c.dims.head_dim_v; ++d) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s)
      sum += sycl::exp2(lse_s[s] - safe_max) *
             p.partial_out[(row * splits + s) * c.dims.head_dim_v + d];
    out[d] = from_float<T>(sum * inv_total);
  }
  p.lse[lse_index(c, seq, b, h, token)] = total > 0.f ? safe_max + sycl::log2(total) : NEG_INF;
}

}  // namespace ipex_flash
