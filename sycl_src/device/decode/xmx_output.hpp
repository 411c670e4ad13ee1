// The end of the decode kernel's register form (decode/xmx_kernel.hpp): each row's sum over its
// lanes and the work-group's sub-groups, its LSE, and O / sum (with one split the sinks' share
// too) into out, or into the split's partial buffers for flash_decode_merge_kernel. O goes
// through SLM a row tile at a time, every sub-group its share of the columns (the accumulators'
// elements read in place made IGC keep O in private memory).
#pragma once

#include <sycl/sycl.hpp>

#include "common/kernel_props.hpp"
#include "common/online_softmax.hpp"
#include "decode/rows.hpp"
#include "matrix/row_tiles.hpp"

namespace ipex_flash {

// What the rows' output takes beside the accumulators: the rows, the split, and the local
// memory it goes through (o_rows: one row tile's O, in Q's bytes; meet: each sub-group's row
// sums; row_scale: each row's factor), with this work-item's place in the work-group.
template <typename T, int ROWS, int M, int SUBGROUPS, int HEAD_DIM_V>
struct DecodeXmxOutput {
  const DecodeRows& rows;
  int split;
  bool one_split;
  float value_scale;  // an FP8 cache's V descale (1 otherwise), into every row's factor
  float (&o_rows)[M][HEAD_DIM_V];
  float (&meet)[SUBGROUPS][ROWS];
  float (&row_scale)[ROWS];
  sycl::group<1> group;
  sycl::sub_group sg;
  int sg_id;  // this sub-group's index
  int lid;    // lane

  // After the last block's barrier. o: this sub-group's O columns (o_col0 + j * N + lane);
  // lane_sum: this lane's share of each row's sum; max_lanes: row r's running max in lane r;
  // COLUMN_WORDS: O's columns in groups of four tiles (decode/xmx_tiles.hpp: value_column).
  template <class Acc, int ROW_TILES, int O_TILES, int N, bool COLUMN_WORDS>
  IPEX_FLASH_INLINE void write(Acc (&o)[ROW_TILES][O_TILES],
                               const float (&lane_sum)[ROW_TILES][M], float max_lanes,
                               int o_col0, int head_dim_v) const {
    constexpr int G = SUBGROUPS;
    float row_sum[ROW_TILES][M];
IPEX_FLASH_TILE_LOOP
    for (int rt = 0; rt < ROW_TILES; ++rt)
IPEX_FLASH_TILE_LOOP
      for (int i = 0; i < M; ++i) {
        row_sum[rt][i] = sycl::reduce_over_group(sg, lane_sum[rt][i], sycl::plus<float>());
        if constexpr (G > 1) {
          if (lid == 0) meet[sg_id][rt * M + i] = row_sum[rt][i];
        }
      }
    sycl::group_barrier(group);  // the sums met; Q (o_rows' bytes) read for the last time
IPEX_FLASH_TILE_LOOP
    for (int rt = 0; rt < ROW_TILES; ++rt) {
IPEX_FLASH_TILE_LOOP
      for (int j = 0; j < O_TILES; ++j)
        matrix_store_acc(sg, o[rt][j], &o_rows[0][o_col0 + j * N], HEAD_DIM_V);
      if (sg_id == 0) {
IPEX_FLASH_TILE_LOOP
        for (int i = 0; i < M; ++i) {
          float sum = row_sum[rt][i];
          if constexpr (G > 1) {
            sum = 0.f;
IPEX_FLASH_TILE_LOOP
            for (int g = 0; g < G; ++g) sum += meet[g][rt * M + i];
          }
          const OnlineSoftmaxRow row{from_lane(sg, max_lanes, rt * M + i), sum};
          const float scale = decode_row_finish(rows, split, one_split, rt * M + i, row, lid);
          if (lid == 0) row_scale[rt * M + i] = scale * value_scale;
        }
      }
      sycl::group_barrier(group);
      // (O's columns as the tiles hold them: decode_write_rows puts them in order)
      decode_write_rows<T, M, HEAD_DIM_V, ROWS, COLUMN_WORDS ? 4 * N : 0>(
          rows, split, one_split, rt * M, o_rows, row_scale, head_dim_v, sg_id * N + lid, G * N);
      sycl::group_barrier(group);  // the row tile written before the next one's O lands
    }
  }
};

}  // namespace ipex_flash
