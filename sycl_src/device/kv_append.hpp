// The append of flash_attn_with_kvcache's new keys and values into the cache, in place: one
// launch before the attention on the same queue, reading the lengths and pages on the device
// (a GPU's launch plan never waits for the host). Elements are copied as bits (ELEMENT: an
// unsigned integer of the dtype's width).
#pragma once

#include <sycl/sycl.hpp>

#include "params.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// One work-item per (sequence, new token, K/V head): copies that head's key and value rows.
// Work-items 0 .. B - 1 also write the lengths after the append.
template <typename ELEMENT>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void kv_append_kernel(KvAppendParams p) {
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int64_t index = static_cast<int64_t>(item.get_global_id(0));
  if (index < p.batch) p.seqlens_after[index] = p.seqlens[index] + p.new_tokens;
  if (index >= static_cast<int64_t>(p.batch) * p.new_tokens * p.heads) return;
  const int64_t head = index % p.heads, token = index / p.heads % p.new_tokens;
  const int64_t b = index / (static_cast<int64_t>(p.heads) * p.new_tokens);
  const int64_t position = p.seqlens[b] + token;
  int64_t slot = b, row = position;  // cache row, and position in it
  if (p.block_table != nullptr) {
    slot = p.block_table[b * p.table_stride + position / p.page_size];
    row = position % p.page_size;
  }
  const auto copy = [&](const void* from, const BhndStrides& from_stride, void* to,
                        const BhndStrides& to_stride, int dim) {
    const ELEMENT* src = static_cast<const ELEMENT*>(from) + b * from_stride.batch +
                         head * from_stride.head + token * from_stride.row;
    ELEMENT* dst = static_cast<ELEMENT*>(to) + slot * to_stride.batch + head * to_stride.head +
                   row * to_stride.row;
    for (int d = 0; d < dim; ++d) dst[d] = src[d];
  };
  copy(p.k_new, p.k_new_stride, p.k_cache, p.k_cache_stride, p.head_dim);
  copy(p.v_new, p.v_new_stride, p.v_cache, p.v_cache_stride, p.head_dim_v);
}

}  // namespace ipex_flash
