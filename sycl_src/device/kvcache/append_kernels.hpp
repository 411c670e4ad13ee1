// The append of flash_attn_with_kvcache's new keys and values into the cache, in place: one
// launch before the attention on the same queue, reading the lengths and pages on the device
// (a GPU's launch plan never waits for the host), where the decode kernel does not append
// them itself (decode/append.hpp). kv_append_kernel stores each element through
// STORE: StoreBits copies it (an unsigned integer of the dtype's width), StoreFp8 quantises a
// 16-bit one into an FP8 cache; kv_append_rotary_kernel also applies the rotary embedding to
// the new keys and to the queries, in float32 as the general path does.
#pragma once

#include <sycl/sycl.hpp>

#include <type_traits>

#include "common/dtypes.hpp"
#include "common/fp8_encode.hpp"
#include "common/params.hpp"
#include "kvcache/params.hpp"
#include "kvcache/rotary.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// Where new token `token` of sequence b goes: the cache row (sequence or page) and position in
// it; and the token's position in its sequence.
struct AppendSlot {
  int64_t slot, row, position;
};

inline AppendSlot append_slot(const KvAppendParams& p, int64_t b, int64_t token) {
  const int64_t position = p.seqlens[b] + token;
  if (p.block_table == nullptr) return {b, position, position};
  return {p.block_table[b * p.table_stride + position / p.page_size], position % p.page_size,
          position};
}

template <typename ELEMENT>
inline ELEMENT* row_at(void* base, const BhndStrides& s, int64_t batch, int64_t head,
                       int64_t row) {
  return static_cast<ELEMENT*>(base) + batch * s.batch + head * s.head + row * s.row;
}

template <typename ELEMENT>
inline const ELEMENT* row_at(const void* base, const BhndStrides& s, int64_t batch,
                             int64_t head, int64_t row) {
  return static_cast<const ELEMENT*>(base) + batch * s.batch + head * s.head + row * s.row;
}

template <typename ELEMENT>
struct StoreBits {
  using In = ELEMENT;
  using Out = ELEMENT;
  StoreBits(const KvAppendParams&, int64_t, int64_t, bool) {}
  Out operator()(In x) const { return x; }
};

// An appended element as the cache stores it: itself, or x / descale rounded to the cache's
// FP8, saturating (fp8_quant.quantise's bytes). Also the decode kernel's (decode/append.hpp).
template <typename Out, typename In>
inline Out cache_element(In x, float descale) {
  if constexpr (std::is_same_v<Out, In>) return x;
  else return fp8_from_float<Out>(to_float(x) / descale);
}

// Quantises with descale[b, head].
template <typename T, typename FP8>
struct StoreFp8 {
  using In = T;
  using Out = FP8;
  float descale;
  StoreFp8(const KvAppendParams& p, int64_t b, int64_t head, bool value)
      : descale((value ? p.v_descale : p.k_descale)[b * p.heads + head]) {}
  Out operator()(In x) const { return cache_element<FP8>(x, descale); }
};

// One work-item per (sequence, new token, K/V head): stores that head's key and value rows.
// Work-items 0 .. B - 1 also write the lengths after the append.
template <typename STORE>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void kv_append_kernel(KvAppendParams p) {
  using In = typename STORE::In;
  using Out = typename STORE::Out;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int64_t index = static_cast<int64_t>(item.get_global_id(0));
  if (index < p.batch) p.seqlens_after[index] = p.seqlens[index] + p.new_tokens;
  if (index >= static_cast<int64_t>(p.batch) * p.new_tokens * p.heads) return;
  const int64_t head = index % p.heads, token = index / p.heads % p.new_tokens;
  const int64_t b = index / (static_cast<int64_t>(p.heads) * p.new_tokens);
  const AppendSlot at = append_slot(p, b, token);
  const In* k = row_at<In>(p.k_new, p.k_new_stride, b, head, token);
  const In* v = row_at<In>(p.v_new, p.v_new_stride, b, head, token);
  Out* k_out = row_at<Out>(p.k_cache, p.k_cache_stride, at.slot, head, at.row);
  Out* v_out = row_at<Out>(p.v_cache, p.v_cache_stride, at.slot, head, at.row);
  const STORE store_k(p, b, head, false), store_v(p, b, head, true);
  for (int d = 0; d < p.head_dim; ++d) k_out[d] = store_k(k[d]);
  for (int d = 0; d < p.head_dim_v; ++d) v_out[d] = store_v(v[d]);
}

// A row of head_dim features rotated at `position` into `out` (kvcache/rotary.hpp).
template <typename T, typename COS>
inline void rotate_row(const KvAppendParams& p, const T* in, T* out, int64_t position) {
  for (int d = 0; d < p.head_dim; ++d) out[d] = rotated_element<T, COS>(p.rotary, in, d, position);
}

// kv_append_kernel with the rotary embedding: work-items past the keys' rotate a query row
// each (sequence, query token, query head) into q_rotated.
template <typename T, typename COS>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void kv_append_rotary_kernel(KvAppendParams p) {
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  int64_t index = static_cast<int64_t>(item.get_global_id(0));
  if (index < p.batch) p.seqlens_after[index] = p.seqlens[index] + p.new_tokens;
  const int64_t key_rows = static_cast<int64_t>(p.batch) * p.new_tokens * p.heads;
  if (index < key_rows) {
    const int64_t head = index % p.heads, token = index / p.heads % p.new_tokens;
    const int64_t b = index / (static_cast<int64_t>(p.heads) * p.new_tokens);
    const AppendSlot at = append_slot(p, b, token);
    rotate_row<T, COS>(p, row_at<T>(p.k_new, p.k_new_stride, b, head, token),
                       row_at<T>(p.k_cache, p.k_cache_stride, at.slot, head, at.row),
                       at.position);
    const T* v = row_at<T>(p.v_new, p.v_new_stride, b, head, token);
    T* v_out = row_at<T>(p.v_cache, p.v_cache_stride, at.slot, head, at.row);
    for (int d = 0; d < p.head_dim_v; ++d) v_out[d] = v[d];
    return;
  }
  index -= key_rows;
  if (index >= static_cast<int64_t>(p.batch) * p.len_q * p.heads_q) return;
  const int64_t head = index % p.heads_q, token = index / p.heads_q % p.len_q;
  const int64_t b = index / (static_cast<int64_t>(p.heads_q) * p.len_q);
  rotate_row<T, COS>(p, row_at<T>(p.q, p.q_stride, b, head, token),
                     row_at<T>(p.q_rotated, p.q_rotated_stride, b, head, token),
                     p.seqlens[b] + (p.rotary.q_positions_advance ? token : 0));
}

}  // namespace ipex_flash
