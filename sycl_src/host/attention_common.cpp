#include "host/attention_common.hpp"

#include <stdexcept>

namespace ipex_flash {
namespace {

constexpr double kLog2e = 1.4426950408889634;

template <typename P>
const P* data_of(const std::optional<TensorView>& t) {
  return t ? reinterpret_cast<const P*>(t->data) : nullptr;
}

}  // namespace

AttentionDims make_dims(const TensorView& q, const TensorView& k, const AttentionOptions& o) {
  const int64_t heads_q = q.size(1), heads_kv = k.size(1);
  if (heads_kv <= 0 || heads_q % heads_kv != 0)
    throw std::invalid_argument("ipex_flash: query heads must be a multiple of key/value heads");
  AttentionDims dims{static_cast<int32_t>(q.size(0)), static_cast<int32_t>(heads_q),
                     static_cast<int32_t>(heads_q / heads_kv), static_cast<int32_t>(q.size(2)),
                     static_cast<int32_t>(k.size(2)), static_cast<int32_t>(q.size(3))};
  if (o.cu_seqlens_q) {
    dims.batch = static_cast<int32_t>(o.cu_seqlens_q->size(0) - 1);
    dims.len_q = o.max_seqlen_q;
  }
  if (o.cu_seqlens_k || o.seqlens_k) dims.len_k = o.max_seqlen_k;
  if (o.seqlens_k) dims.batch = static_cast<int32_t>(o.seqlens_k->size(0));
  return dims;
}

AttentionCommon make_common(const TensorView& q, const TensorView& k, const TensorView& lse,
                            const AttentionOptions& o) {
  AttentionCommon c{};
  c.dims = make_dims(q, k, o);

  c.seq = SeqLayout{data_of<int32_t>(o.cu_seqlens_q), data_of<int32_t>(o.cu_seqlens_k),
                    data_of<int32_t>(o.seqlens_k), data_of<int32_t>(o.block_table),
                    o.block_table ? o.block_table->strides.at(0) : 0, o.page_size};
  c.mask = o.mask;
  c.score_mod = ScoreModParams{o.softcap, data_of<float>(o.alibi_slopes), 0};
  if (o.alibi_slopes && o.alibi_slopes->sizes.size() == 2)
    c.score_mod.alibi_batch_stride = o.alibi_slopes->strides[0];
  c.dropout = o.dropout;
  c.lse_stride = lse.sizes.size() == 3 ? LseStrides{lse.strides[0], lse.strides[1]}
                                        : LseStrides{0, lse.strides.at(0)};
  c.scale = o.scale;
  // With softcap the dot products feed tanh(x / softcap); without, they go straight to exp2.
  c.q_prescale = o.softcap > 0.f ? static_cast<float>(o.scale / o.softcap)
                                 : static_cast<float>(o.scale * kLog2e);
  return c;
}

}  // namespace ipex_flash
