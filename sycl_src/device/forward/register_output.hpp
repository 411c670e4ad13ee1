// The register forward's output (forward/registers_kernel.hpp): each lane's row of O, read from
// its column of the O^T accumulators, normalised, and its log-sum-exp.
#pragma once

#include <sycl/sycl.hpp>

#include "common/block_schedule.hpp"
#include "common/dtypes.hpp"
#include "common/kernel_props.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "common/seq_info.hpp"
#include "forward/params.hpp"
#include "matrix/registers.hpp"

namespace ipex_flash {

// Writes the lane's output row from the O^T accumulators (column d0 + d of the row is element
// d % M of tile d / M), normalised, and where d0 = 0 its log-sum-exp. Called by every lane of
// the sub-group (the column reads are collective).
template <typename T, int M, typename Acc, int TILES>
__attribute__((always_inline)) inline void write_output_from_tiles(
    const FwdParams& p, const QueryBlock& block, int lid, int d0, sycl::sub_group sg,
    Acc (&o)[TILES], const OnlineSoftmaxRow& softmax, float v_descale) {
  const AttentionCommon& c = p.common;
  const SeqInfo& seq = block.seq;
  const int64_t row = block.begin + lid;
  const bool inside = row < seq.len_q;
  const float inv_sum = softmax.inverse_sum() * v_descale;
  T* out = static_cast<T*>(p.out) + block.batch * p.out_stride.batch +
           block.head * p.out_stride.head +
           (seq.q_row0 + (inside ? row : 0)) * p.out_stride.row + d0;
  float values[TILES * M];
  lane_row_of_tiles<M>(sg, o, values);
  if (!inside) return;
IPEX_FLASH_TILE_LOOP
  for (int d = 0; d < TILES * M; ++d)
    if (d0 + d < c.dims.head_dim_v) out[d] = from_float<T>(values[d] * inv_sum);
  if (d0 == 0) p.lse[lse_index(c, seq, block.batch, block.head, row)] = softmax.log2_sum_exp();
}

}  // namespace ipex_flash
