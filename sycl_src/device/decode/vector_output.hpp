// The end of the decode kernel's vector form (decode/kernel.hpp): each K/V head's rows' LSE and
// output. Row statistics live in the row's lanes (lane l: row l / KEYS_PER_STEP); the output is
// written with lanes along d. With one split (DECODE_ONE_SPLIT_WRITES) the work-group holds
// every key of its rows: it does the merge kernel's part itself (decode/merge_kernel.hpp: the
// head's sink as one more term of the denominator) and writes the output and LSE, and the host
// launches no merge; otherwise the split's partial output and LSE.
#pragma once

#include <sycl/sycl.hpp>

#include "common/kv_quant.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "decode/merge_kernel.hpp"
#include "decode/params.hpp"
#include "decode/rows.hpp"

namespace ipex_flash {

// row_factor: the kernel's local memory for each row's output factor, one head at a time.
template <class Tr>
__attribute__((always_inline)) inline void decode_vector_write(
    sycl::group<1> group, const DecodeRows& rows, const DecodeRowState<Tr>& state,
    float (&row_factor)[Tr::FACTOR_HEADS][Tr::LANES], int group_heads, int split, int head_dim_v,
    int lid) {
  using T = typename Tr::T;
  using Row = typename Tr::Row;
  constexpr int LANES = Tr::LANES, KEYS_PER_STEP = Tr::KEYS_PER_STEP;
  constexpr int GROUP_ROWS = Tr::GROUP_ROWS, HEAD_DIM = Tr::HEAD_DIM;
  const DecodeParams& p = rows.p;
  const AttentionCommon& c = p.common;
  const int b = rows.b;
  const int my_row = lid / KEYS_PER_STEP, my_key = lid % KEYS_PER_STEP;
  const bool valid_row = my_row < rows.count;
  const bool one_split = DECODE_ONE_SPLIT_WRITES && c.num_blocks == 1;
  for (int hk = 0; hk < group_heads; ++hk) {
    const int h_kv = rows.head0 + hk;
    const OnlineSoftmaxRow softmax{state.row_max[hk][lid], state.row_sum[hk][lid]};
    const float lse = softmax.log2_sum_exp();
    float share = 1.f;  // of the final denominator, with one split
    if (one_split) {
      const int h = rows.query_head(h_kv, valid_row ? my_row : 0);
      const SplitShare total = split_share(c.score_mod.sinks, h, lse);
      share = total.share;
      if (valid_row && my_key == 0)
        p.lse[lse_index(c, rows.seq, b, h, rows.token(my_row))] = total.lse;
    } else if (valid_row && my_key == 0) {
      p.partial_lse[rows.index(hk, my_row) * c.num_blocks + split] = lse;
    }
    row_factor[0][lid] =
        softmax.inverse_sum() * (kv_descale<Tr::FEATURES>(c, b, h_kv).v * Row::UNIT) * share;
    sycl::group_barrier(group);
    for (int r = 0; r < GROUP_ROWS && r < rows.count; ++r) {
      if (one_split) {
        T* out = static_cast<T*>(p.out) + b * p.out_stride.batch +
                 rows.query_head(h_kv, r) * p.out_stride.head + rows.token(r) * p.out_stride.row;
        for (int i = lid; i < HEAD_DIM; i += LANES) {
          const int d = Row::column(i / LANES, lid);
          if (d < head_dim_v)
            out[d] = from_float<T>(state.acc[hk][r][i] * row_factor[0][r * KEYS_PER_STEP]);
        }
        continue;
      }
      float* partial = p.partial_out + (rows.index(hk, r) * c.num_blocks + split) * head_dim_v;
      for (int i = lid; i < HEAD_DIM; i += LANES) {
        const int d = Row::column(i / LANES, lid);
        if (d < head_dim_v)
          partial[d] = state.acc[hk][r][i] * row_factor[0][r * KEYS_PER_STEP];
      }
    }
    sycl::group_barrier(group);  // before the next head overwrites row_factor
  }
}

}  // namespace ipex_flash
