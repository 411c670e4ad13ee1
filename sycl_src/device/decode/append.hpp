// flash_attn_with_kvcache's append inside the decode kernel (FEATURE_APPEND): a decode step
// that brings new keys and values is one launch, where kv_append_kernel and the attention
// were two. New token i of sequence b is key seqlens_k[b] - k_start[b] + i of the lengths the
// kernel sees (SeqLayout::keys_appended), so it falls in one split; the work-group of that
// split writes it for its K/V heads, then reads it back with the rest of the block (the
// caller's group barrier orders the two). Every element is written by exactly one work-group:
// the host fuses the append only where a K/V head group's rows are not sliced across
// work-groups (host/variants/decode_variant.cpp). An FP8 cache's new tokens are quantised as
// kv_append_kernel's are (cache_element), so the attention reads the bytes the cache keeps;
// with FEATURE_ROTARY the new keys are rotated as kv_append_rotary_kernel's are
// (kvcache/rotary.hpp), and so are the queries as they are read (decode/rows.hpp).
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>
#include <cstdint>

#include "decode/traits.hpp"
#include "kvcache/append_kernels.hpp"
#include "common/kv_quant.hpp"
#include "common/params.hpp"
#include "decode/params.hpp"
#include "kvcache/rotary.hpp"
#include "common/seq_info.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

// One appended row of `columns` elements, lanes along the row; a key rotated at `position`
// with FEATURE_ROTARY (value rows: position < 0).
template <class Tr>
inline void append_cache_row(const DecodeParams& p, const typename Tr::T* in,
                             const typename Tr::KV* cache_row, int columns, float descale,
                             int64_t position, int lid) {
  using T = typename Tr::T;
  auto* out = const_cast<typename Tr::KV*>(cache_row);  // a row of the cache the call appends to
  for (int d = lid; d < columns; d += Tr::LANES) {
    T x = in[d];
    if constexpr (Tr::ROTARY) {
      if (position >= 0) x = rotated_element<T, typename Tr::Cos>(p.rotary, in, d, position);
    }
    out[d] = cache_element<typename Tr::KV>(x, descale);
  }
}

// Writes the new keys and values of split [split_begin, split_begin + p.split_keys) of
// sequence b for K/V heads head0 .. head0 + group_heads - 1, but for a key whose page is not
// in the pool. seq: the lengths after the append.
template <class Tr>
inline void decode_append(const DecodeParams& p, const SeqInfo& seq, const DecodeColumns& cols,
                          int b, int head0, int group_heads, int64_t split_begin, int lid) {
  using T = typename Tr::T;
  using KV = typename Tr::KV;
  const AttentionCommon& c = p.common;
  const int64_t first_new = static_cast<int64_t>(seq.len_k) - c.seq.keys_appended;
  const int64_t begin = std::max(split_begin, first_new);
  const int64_t end = std::min<int64_t>(split_begin + p.split_keys, seq.len_k);
  for (int64_t key = begin; key < end; ++key) {
    if (!key_page_in_pool(c, p.bounds, b, key)) continue;
    const int64_t token = key - first_new;
    for (int hk = 0; hk < group_heads; ++hk) {
      const int h_kv = head0 + hk;
      const KvDescale descale = kv_descale<Tr::FEATURES>(c, b, h_kv);
      append_cache_row<Tr>(p, row_at<T>(p.k_new, p.k_new_stride, b, h_kv, token),
                           kv_rows<KV>(p.k, p.k_stride, c, seq, b, h_kv).row(key),
                           cols.head_dim, descale.k, c.seq.seqlens_k[b] + token, lid);
      append_cache_row<Tr>(p, row_at<T>(p.v_new, p.v_new_stride, b, h_kv, token),
                           kv_rows<KV>(p.v, p.v_stride, c, seq, b, h_kv).row(key),
                           cols.head_dim_v, descale.v, -1, lid);
    }
  }
}

}  // namespace ipex_flash
