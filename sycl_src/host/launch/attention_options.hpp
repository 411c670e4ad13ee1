// The options of one attention call as Python hands them over, and their translation into
// the kernels' AttentionCommon (sizes, masks, score changes, sequence layout).
#pragma once

#include <sycl/sycl.hpp>

#include <optional>

#include "host/launch/tensor_view.hpp"
#include "host/variants/kernel_variant.hpp"
#include "device/common/params.hpp"

namespace ipex_flash {

struct AttentionOptions {
  float scale = 1.f;                         // softmax scale
  MaskParams mask{-1, -1, 0};                // windows and diagonal alignment
  DropoutParams dropout{0, 0, 0, 1.f, 0};    // see make_dropout
  float softcap = 0.f;                       // 0 = off
  std::optional<TensorView> alibi_slopes;    // (Hq,) or (B, Hq) float32
  std::optional<TensorView> attn_mask;       // (B, Hq, Nq, Nk) view, broadcast dims stride 0
  std::optional<TensorView> sinks;           // (Hq,) float32
  std::optional<TensorView> k_descale;       // (B, Hkv) float32, contiguous: FP8 caches
  std::optional<TensorView> v_descale;       // (B, Hkv) float32, contiguous
  std::optional<TensorView> cu_seqlens_q;    // (B + 1) int32: q packed as (1, Hq, total, D)
  std::optional<TensorView> cu_seqlens_k;    // (B + 1) int32: k, v packed likewise
  std::optional<TensorView> seqlens_k;       // (B) int32: keys per sequence of a KV cache
  std::optional<TensorView> block_table;     // (B, max_pages) int32: paged KV cache
  std::optional<TensorView> k_start;         // (B) int32: first key row of each cache (leftpad)
  // (B, Hkv, Nnew, D) and (B, Hkv, Nnew, Dv) views in q's dtype: new keys and values the decode
  // kernel appends to the cache at seqlens_k[b] + i before it attends (flash_decode only);
  // seqlens_k are then the lengths before the append, max_seqlen_k the most after it.
  std::optional<TensorView> k_new;
  std::optional<TensorView> v_new;
  // With k_new: the rotary embedding of the new keys and the queries (RotaryParams), tables
  // (seqlen_ro, rotary_dim / 2) in float32 or q's dtype.
  std::optional<TensorView> rotary_cos;
  std::optional<TensorView> rotary_sin;
  bool rotary_interleaved = false;
  bool rotary_q_positions_advance = false;
  // (B + 1) int32 prefix sums of the keys each sequence of a KV cache attends to, and their
  // total (keys_used, read by the caller): the matrix forward packs only those (pack_rows.hpp);
  // without them it packs max_seqlen_k keys per sequence.
  std::optional<TensorView> cu_keys_used;
  int64_t keys_used = 0;
  // A block of a larger attention: GlobalPositions' table, int64, header and entries.
  std::optional<TensorView> positions;
  int32_t page_size = 0;                     // keys per page when paged
  int32_t max_seqlen_q = -1;                 // with cu_seqlens_q
  int32_t max_seqlen_k = -1;                 // with cu_seqlens_k, seqlens_k
};

// The problem's sizes (AttentionDims) from q, k, v and the options; see make_common. k's head
// dim must be q's; v's (head_dim_v) may differ.
AttentionDims make_dims(const TensorView& q, const TensorView& k, const TensorView& v,
                        const AttentionOptions& options);

// q (B, Hq, Nq, D) or packed (1, Hq, total_q, D); k likewise, or the KV cache
// (B, Hkv, capacity, D), or its pages (num_pages, Hkv, page_size, D); v like k with its own
// head dim Dv. lse (B, Hq, Nq), or (Hq, total_q) when packed. num_blocks is left for the
// launcher.
// The user's mask as the kernels read it in place (none: data null); bits unset.
AttnMaskParams attn_mask_params(const AttentionOptions& options);

AttentionCommon make_common(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& lse, const AttentionOptions& options);

// A KV cache's bounds as the decode kernel takes them (CacheBounds): the rows a sequence's keys
// may reach (the block table's pages, or k's rows) and the pages of a paged cache.
CacheBounds cache_bounds(const TensorView& k, const AttentionOptions& o);

// Where a matrix kernel's pack keeps each sequence's blocks (pack_rows.hpp): blocks of
// `block` keys of k (a packed batch by cu_seqlens_k, a KV cache by cu_keys_used, else
// max_seqlen_k keys per sequence), or of `block` query rows of q (by cu_seqlens_q).
PackRows key_pack_rows(const AttentionDims& dims, const TensorView& k,
                       const AttentionOptions& options, int block);
PackRows row_pack_rows(const AttentionDims& dims, const TensorView& q,
                       const AttentionOptions& options, int block);

// Pointers and strides of the tensors a forward-style kernel (FwdParams, DecodeParams) reads
// and writes.
template <typename Params>
void set_forward_tensors(Params& params, const TensorView& q, const TensorView& k,
                         const TensorView& v, const TensorView& out, const TensorView& lse) {
  params.q = reinterpret_cast<const void*>(q.data);
  params.k = reinterpret_cast<const void*>(k.data);
  params.v = reinterpret_cast<const void*>(v.data);
  params.out = reinterpret_cast<void*>(out.data);
  params.lse = reinterpret_cast<float*>(lse.data);
  params.q_stride = bhnd_strides(q, "q");
  params.k_stride = bhnd_strides(k, "k");
  params.v_stride = bhnd_strides(v, "v");
  params.out_stride = bhnd_strides(out, "out");
}

// The FEATURE_* bits a call needs compiled in; k (or its cache) says the K/V element type.
int features_of(const AttentionOptions& options, const TensorView& k);

// FEATURE_KV_E4M3 or FEATURE_KV_E5M2 for an FP8 K/V dtype, 0 otherwise.
int kv_feature(const std::string& kv_dtype);

// Work-groups of a launch: `blocks` per (batch, head), each `group_size` work-items.
inline sycl::nd_range<1> block_range(int64_t batch_heads, int64_t blocks, int group_size) {
  return sycl::nd_range<1>{static_cast<size_t>(batch_heads * blocks * group_size),
                           static_cast<size_t>(group_size)};
}

}  // namespace ipex_flash
