#include "host/launch/attention_options.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "device/matrix/pack_rows.hpp"

namespace ipex_flash {
namespace {

constexpr double kLog2e = 1.4426950408889634;

template <typename P>
const P* data_of(const std::optional<TensorView>& t) {
  return t ? reinterpret_cast<const P*>(t->data) : nullptr;
}

// The FEATURE_MASK_* bit of a mask's dtype.
int attn_mask_feature(const std::string& dtype) {
  if (dtype == "bool") return FEATURE_MASK_BOOL;
  if (dtype == "float32") return FEATURE_MASK_F32;
  if (dtype == "float16") return FEATURE_MASK_F16;
  if (dtype == "bfloat16") return FEATURE_MASK_BF16;
  throw std::invalid_argument("ipex_flash: attn_mask must be bool, float32, float16 or bfloat16, got " +
                              dtype);
}

}  // namespace

int kv_feature(const std::string& kv_dtype) {
  return kv_dtype == "float8_e4m3fn" ? FEATURE_KV_E4M3
         : kv_dtype == "float8_e5m2" ? FEATURE_KV_E5M2
                                     : 0;
}

int features_of(const AttentionOptions& options, const TensorView& k) {
  return kv_feature(k.dtype) | (options.softcap > 0.f ? FEATURE_SOFTCAP : 0) |
         (options.alibi_slopes ? FEATURE_ALIBI : 0) |
         (options.attn_mask ? attn_mask_feature(options.attn_mask->dtype) : 0) |
         (options.positions ? FEATURE_PLACED : 0);
}

AttentionDims make_dims(const TensorView& q, const TensorView& k, const TensorView& v,
                        const AttentionOptions& o) {
  const int64_t heads_q = q.size(1), heads_kv = k.size(1);
  if (heads_kv <= 0 || heads_q % heads_kv != 0)
    throw std::invalid_argument("ipex_flash: query heads must be a multiple of key/value heads");
  AttentionDims dims{static_cast<int32_t>(q.size(0)), static_cast<int32_t>(heads_q),
                     static_cast<int32_t>(heads_q / heads_kv), static_cast<int32_t>(q.size(2)),
                     static_cast<int32_t>(k.size(2)), static_cast<int32_t>(q.size(3)),
                     static_cast<int32_t>(v.size(3))};
  if (k.size(3) != q.size(3))
    throw std::invalid_argument("ipex_flash: k's head dim (" + std::to_string(k.size(3)) +
                                ") must equal q's (" + std::to_string(q.size(3)) + ")");
  if (v.size(1) != heads_kv || v.size(2) != k.size(2))
    throw std::invalid_argument("ipex_flash: v must have k's heads and keys");
  if (o.cu_seqlens_q) {
    dims.batch = static_cast<int32_t>(o.cu_seqlens_q->size(0) - 1);
    dims.len_q = o.max_seqlen_q;
  }
  if (o.cu_seqlens_k || o.seqlens_k) dims.len_k = o.max_seqlen_k;
  if (o.seqlens_k) dims.batch = static_cast<int32_t>(o.seqlens_k->size(0));
  return dims;
}

CacheBounds cache_bounds(const TensorView& k, const AttentionOptions& o) {
  return {static_cast<int32_t>(o.block_table ? o.block_table->size(1) * o.page_size : k.size(2)),
          static_cast<int32_t>(o.block_table ? k.size(0) : 0)};
}

AttnMaskParams attn_mask_params(const AttentionOptions& o) {
  if (!o.attn_mask) return AttnMaskParams{};
  const TensorView& m = *o.attn_mask;
  if (m.sizes.size() != 4)
    throw std::invalid_argument("ipex_flash: attn_mask must be viewed as (B, Hq, Nq, Nk)");
  const int64_t bytes = element_bytes(m.dtype);
  return AttnMaskParams{data_of<void>(o.attn_mask), m.strides[0] * bytes, m.strides[1] * bytes,
                        m.strides[2] * bytes, m.strides[3] * bytes};
}

// The table's shape and type are checked here: the kernels read it by address. Its header's
// values (on the device) are the caller's (ipex_flash.ops.flash_attn_args.BlockPositions).
static GlobalPositions global_positions(const AttentionOptions& o, const AttentionDims& dims) {
  if (!o.positions) return GlobalPositions{nullptr};
  const TensorView& t = *o.positions;
  if (t.dtype != "int64" || t.sizes.size() != 1 || t.strides[0] != 1 ||
      (t.size(0) != 7 && t.size(0) != 4 + 3 * static_cast<int64_t>(dims.batch)))
    throw std::invalid_argument(
        "ipex_flash: positions must be a contiguous int64 tensor of 4 + 3 or 4 + 3 * B values");
  return GlobalPositions{data_of<int64_t>(o.positions)};
}

AttentionCommon make_common(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& lse, const AttentionOptions& o) {
  AttentionCommon c{};
  c.dims = make_dims(q, k, v, o);

  c.seq = SeqLayout{data_of<int32_t>(o.cu_seqlens_q), data_of<int32_t>(o.cu_seqlens_k),
                    data_of<int32_t>(o.seqlens_k), data_of<int32_t>(o.block_table),
                    data_of<int32_t>(o.k_start),
                    o.block_table ? o.block_table->strides.at(0) : 0, o.page_size,
                    o.k_new ? static_cast<int32_t>(o.k_new->size(2)) : 0};
  // k_start moves the base row, which kv_rows applies before the page lookup: right only for
  // one page per sequence (cache_batch_idx), so a real paged cache cannot take it.
  if (o.k_start && o.block_table && o.block_table->size(1) != 1)
    throw std::invalid_argument("ipex_flash: k_start (cache_leftpad) with a paged KV cache is not supported");
  // The decode kernels look a page up once per run of 16 keys (decode/scores.hpp,
  // DECODE_KEY_RUN), which needs whole runs in each page; one page per sequence holds them all.
  if (o.block_table && o.block_table->size(1) != 1 && o.page_size % 16 != 0)
    throw std::invalid_argument("ipex_flash: a paged KV cache's page_size must be a multiple of 16, got " +
                                std::to_string(o.page_size));
  c.mask = o.mask;
  c.score_mod = ScoreModParams{o.softcap, data_of<float>(o.alibi_slopes), 0, AttnMaskParams{},
                               data_of<float>(o.sinks)};
  c.score_mod.attn_mask = attn_mask_params(o);
  if (o.alibi_slopes && o.alibi_slopes->sizes.size() == 2)
    c.score_mod.alibi_batch_stride = o.alibi_slopes->strides[0];
  c.dropout = o.dropout;
  c.positions = global_positions(o, c.dims);
  c.kv_descale = KvDescaleParams{data_of<float>(o.k_descale), data_of<float>(o.v_descale)};
  c.lse_stride = lse.sizes.size() == 3 ? LseStrides{lse.strides[0], lse.strides[1]}
                                        : LseStrides{0, lse.strides.at(0)};
  c.scale = o.scale;
  // With softcap the dot products feed tanh(x / softcap); without, they go straight to exp2.
  c.q_prescale = o.softcap > 0.f ? static_cast<float>(o.scale / o.softcap)
                                 : static_cast<float>(o.scale * kLog2e);
  return c;
}

PackRows key_pack_rows(const AttentionDims& dims, const TensorView& k, const AttentionOptions& o,
                       int block) {
  const int64_t seq_blocks = ceil_div(std::max(dims.len_k, 1), block);
  if (o.cu_seqlens_k)  // k is (1, Hkv, total, D): cu_seqlens_k ends within it
    return pack_rows(data_of<int32_t>(o.cu_seqlens_k), k.size(2), dims.batch, seq_blocks, block);
  if (o.seqlens_k && o.cu_keys_used) {
    // int32 prefix sums: a total past 2^31 would have wrapped them.
    if (o.keys_used < 0 || o.keys_used > INT32_MAX || o.cu_keys_used->size(0) != dims.batch + 1)
      throw std::invalid_argument(
          "ipex_flash: cu_keys_used must be (B + 1,) and keys_used in [0, 2^31), got " +
          std::to_string(o.keys_used));
    return pack_rows(data_of<int32_t>(o.cu_keys_used), o.keys_used, dims.batch, seq_blocks,
                     block);
  }
  return pack_rows(nullptr, 0, dims.batch, seq_blocks, block);
}

PackRows row_pack_rows(const AttentionDims& dims, const TensorView& q, const AttentionOptions& o,
                       int block) {
  const int64_t seq_blocks = ceil_div(std::max(dims.len_q, 1), block);
  return pack_rows(data_of<int32_t>(o.cu_seqlens_q), o.cu_seqlens_q ? q.size(2) : 0, dims.batch,
                   seq_blocks, block);
}

}  // namespace ipex_flash
