// What both forward kernels (forward/vector_kernel.hpp, forward/matrix_kernel.hpp) do at the
// edges of their query block: find its Q rows and K/V rows, and at the end write each
// work-item's row, normalised by its softmax sum, with its log-sum-exp.
#pragma once

#include "common/block_schedule.hpp"
#include "common/dtypes.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "forward/params.hpp"
#include "common/seq_info.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

// The block's first Q row and its K/V rows (contiguous, packed or paged), whose elements are
// KV: T, or an FP8 type (common/kv_quant.hpp).
template <typename T, typename KV = T>
struct ForwardOperands {
  const T* q;
  KvRows<KV> k;
  KvRows<KV> v;
};

template <typename T, typename KV = T>
inline ForwardOperands<T, KV> forward_operands(const FwdParams& p, const QueryBlock& block) {
  const AttentionCommon& c = p.common;
  const SeqInfo& seq = block.seq;
  const T* q = static_cast<const T*>(p.q) + block.batch * p.q_stride.batch +
               block.head * p.q_stride.head + (seq.q_row0 + block.begin) * p.q_stride.row;
  return ForwardOperands<T, KV>{
      q, kv_rows<KV>(p.k, p.k_stride, c, seq, block.batch, block.head_kv),
      kv_rows<KV>(p.v, p.v_stride, c, seq, block.batch, block.head_kv)};
}

// acc_t (d, q): the block's unnormalised output, transposed; lid: the work-item's row in it;
// v_descale: an FP8 cache's V descale (common/kv_quant.hpp), folded into the normalisation.
template <typename T, int HEAD_DIM, int BLOCK_M>
inline void write_output_row(const FwdParams& p, const QueryBlock& block, int lid,
                             const float (&acc_t)[HEAD_DIM][BLOCK_M],
                             const OnlineSoftmaxRow& softmax, float v_descale = 1.f) {
  const AttentionCommon& c = p.common;
  const SeqInfo& seq = block.seq;
  const int64_t row = block.begin + lid;
  if (row >= seq.len_q) return;
  const float inv_sum = softmax.inverse_sum() * v_descale;  // an FP8 cache's (common/kv_quant.hpp)
  T* out = static_cast<T*>(p.out) + block.batch * p.out_stride.batch +
           block.head * p.out_stride.head + (seq.q_row0 + row) * p.out_stride.row;
  for (int d = 0; d < c.dims.head_dim_v; ++d) out[d] = from_float<T>(acc_t[d][lid] * inv_sum);
  p.lse[lse_index(c, seq, block.batch, block.head, row)] = softmax.log2_sum_exp();
}

}  // namespace ipex_flash
