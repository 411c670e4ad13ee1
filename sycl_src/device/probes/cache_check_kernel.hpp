// The check of a KV cache's values on the device, for a launch plan on a device that does not
// share host memory (a GPU), in one of two ways:
// - after the attention, which the host does not wait for (a flash_attn_with_kvcache decode
//   step, and the serving call's one-token step): the attention ran bounded by the cache
//   whatever the values (bounded_seq_info, split_pages_in_pool);
//   where a value is out of range this kernel records which in a word of host memory, which
//   the next call on the device reports (host/launch/cache_check_launch.cpp), and sets the call's
//   output (and LSE) to NaN, so that an answer computed from out-of-range values is never taken for
//   real;
// - before it, as the one read the host waits for (the serving call's steps of several query
//   tokens, whose plan needs to know first whether its kernel serves the step): the bits and
//   the most keys a sequence attends to, written to host memory.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "common/params.hpp"
#include "probes/params.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// The bits of sequence b's values; `attended`: the keys it attends to.
inline uint32_t sequence_errors(const CacheCheckParams& p, int64_t b, int64_t& attended) {
  const int64_t keys = p.seqlens[b], start = p.k_start != nullptr ? p.k_start[b] : 0;
  attended = keys + p.appended - start;
  uint32_t bits = 0;
  if (!keys_fit_cache(keys, p.appended, p.capacity)) bits |= kSeqlensOutOfRange;
  if (!start_within_keys(start, keys)) bits |= kLeftpadOutOfRange;
  if (p.rotary_rows > 0 && keys + p.rotated > p.rotary_rows) bits |= kRotaryTooShort;
  if (attended < p.min_keys) bits |= kFewerKeysThanMin;
  if (p.cu_seqlens_q != nullptr &&
      (p.cu_seqlens_q[b] != b * p.queries || p.cu_seqlens_q[b + 1] != (b + 1) * p.queries))
    bits |= kQueriesNotUniform;
  return bits;
}

// NaN of the element's width, as bits (float32, or float16 and bfloat16 alike: 0x7fff is a
// NaN of both).
inline void fill_nan(const FillView& view, int64_t index) {
  int64_t offset = 0;
  for (int d = 3; d >= 0; --d) {
    offset += index % view.sizes[d] * view.strides[d];
    index /= view.sizes[d];
  }
  if (view.element_bytes == 4) static_cast<uint32_t*>(view.data)[offset] = 0x7fc00000u;
  else static_cast<uint16_t*>(view.data)[offset] = 0x7fffu;
}

inline void fill_view(const FillView& view, int lid, int group) {
  if (view.data == nullptr) return;
  const int64_t count = view.sizes[0] * view.sizes[1] * view.sizes[2] * view.sizes[3];
  for (int64_t i = lid; i < count; i += group) fill_nan(view, i);
}

// One work-group.
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void cache_check_kernel(CacheCheckParams p) {
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int lid = static_cast<int>(item.get_local_id(0));
  const int group = static_cast<int>(item.get_local_range(0));
  uint32_t bits = 0;
  int64_t most = 0;
  for (int64_t b = lid; b < p.batch; b += group) {
    int64_t attended;
    bits |= sequence_errors(p, b, attended);
    most = sycl::max(most, attended);
  }
  if (p.block_table != nullptr) {
    // Only the pages a sequence reads: entries past its keys may hold anything (vLLM leaves
    // stale pages there, transformers -1), as in flash-attn.
    const int64_t entries = static_cast<int64_t>(p.batch) * p.table_width;
    for (int64_t i = lid; i < entries; i += group) {
      const int64_t b = i / p.table_width, column = i % p.table_width;
      if (column * p.page_size >= static_cast<int64_t>(p.seqlens[b]) + p.appended) continue;
      const int32_t page = p.block_table[b * p.table_stride + column];
      if (!page_in_pool(page, p.pages)) bits |= kPageOutOfRange;
    }
  }
  // The work-group's bits and most: each sub-group's through a word of local memory.
  static syclexp::work_group_static<uint32_t[kCacheCheckSubGroups]> group_bits;
  static syclexp::work_group_static<int64_t[kCacheCheckSubGroups]> group_most;
  const sycl::sub_group sg = item.get_sub_group();
  bits = sycl::reduce_over_group(sg, bits, sycl::bit_or<uint32_t>());
  most = sycl::reduce_over_group(sg, most, sycl::maximum<int64_t>());
  const int sub_groups = static_cast<int>(sg.get_group_linear_range());
  if (sg.leader()) {
    group_bits[sg.get_group_linear_id()] = bits;
    group_most[sg.get_group_linear_id()] = most;
  }
  sycl::group_barrier(item.get_group());
  for (int i = 0; i < sub_groups; ++i) {
    bits |= group_bits[i];
    most = sycl::max(most, group_most[i]);
  }
  if (p.report != nullptr) {  // read before the attention
    if (lid == 0) {
      p.report[0] = static_cast<int32_t>(bits);
      p.report[1] = static_cast<int32_t>(most);
    }
    return;
  }
  bits &= p.errors;
  if (bits == 0) return;
  if (lid == 0) *p.error |= bits | p.caller;
  fill_view(p.out, lid, group);
  fill_view(p.lse, lid, group);
}

}  // namespace ipex_flash
