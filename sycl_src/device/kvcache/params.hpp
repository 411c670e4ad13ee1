// The KV-cache append's parameters and the rotary embedding it and decode apply.
// Shared verbatim by the host launchers (g++) and the device code (compiled at run time by the
// kernel compiler). Plain C++ only: no SYCL types here.
#pragma once

#include <cstdint>

#include "common/params.hpp"

namespace ipex_flash {

// The rotary embedding flash_attn_with_kvcache applies to new keys and to the queries
// (kvcache/rotary.hpp): a row's first rotary_dim features rotated at a position's row of the
// tables, pairs (2i, 2i + 1) when interleaved (GPT-J), else (i, i + rotary_dim / 2) (GPT-NeoX). New
// token i of sequence b is at seqlens[b] + i; query i too when q_positions_advance, else all
// queries at seqlens[b] (the lengths before the append, left pads included).
struct RotaryParams {
  const void* cos;  // (seqlen_ro, rotary_dim / 2), rows contiguous
  const void* sin;
  int64_t cos_stride;
  int32_t rotary_dim, interleaved, q_positions_advance;
  int32_t rows;     // the tables' rows: positions past them read the nearest (0: unchecked)
};

// New keys and values written into a KV cache (kvcache/append_kernels.hpp), as
// flash_attn_with_kvcache appends them: token i of sequence b at cache position seqlens[b] + i.
struct KvAppendParams {
  const void* k_new;            // (B, Nnew, Hkv, D), read through strides
  const void* v_new;            // (B, Nnew, Hkv, Dv)
  void* k_cache;                // (B_cache or pages, capacity or page_size, Hkv, D)
  void* v_cache;
  const int32_t* seqlens;       // (B): keys before the append
  const int32_t* block_table;   // (B, table_stride) pages, or null: cache row b is sequence b
  int32_t* seqlens_after;       // (B): seqlens + Nnew, the keys the attention then reads
  BhndStrides k_new_stride, v_new_stride, k_cache_stride, v_cache_stride;  // in elements
  int64_t table_stride;
  int32_t batch, new_tokens, heads, head_dim, head_dim_v, page_size;
  // 16-bit k_new, v_new into an FP8 cache (StoreFp8): their descales, (B, Hkv) float32 each.
  const float* k_descale;
  const float* v_descale;
  // Rotary embedding (kv_append_rotary_kernel): the new keys rotated before they are written,
  // and the queries into q_rotated.
  RotaryParams rotary;
  const void* q;
  void* q_rotated;
  BhndStrides q_stride, q_rotated_stride;
  int32_t heads_q, len_q;
};

}  // namespace ipex_flash
