// Decoding on the matrix engine with every tile in registers: the decode kernel's form for the
// 16-wide XMX GPUs (PVC, BMG, Lunar Lake), 16-bit and FP8 caches, in sycl-tla's orientation
// (matrix/row_tiles.hpp). The query rows of one K/V head (GQA group x new tokens, 8 or 16:
// ROWS) are the DPAS tiles' M rows, so each K/V element read feeds all of them on XMX:
//   S (rows, keys) = Q (rows, d) . K^T (d, keys)    K^T's tiles loaded from K's rows in place
//   online softmax per row                         row r's max in lane r, sums per lane
//   O (rows, dv) = rescale * O + P (rows, keys) . V (keys, dv)   V's tiles from its rows
// Q is staged once in SLM and read as A tiles (in registers where they fit); S and O stay in
// registers through the keys; P goes to A tiles through SLM, O through SLM once at the end
// (decode/xmx_output.hpp; what IGC made of the other forms: docs/matrix_kernels.md); K's and V's
// tiles as decode/xmx_tiles.hpp reads them. A work-group per (batch, K/V head, split of the
// keys, slice of ROWS rows), of SUBGROUPS sub-groups where O would not fit one (head dims past
// 128, MLA's 512 latent columns): each computes S for its share of a block's key tiles and O for
// its share of the columns. A split writes its partial output and LSE for
// flash_decode_merge_kernel, or with one split the output. Key blocks walk as the forward's
// (run_blocks): the fully visible ones in a loop of in-place loads without the mask's code; a
// window's edge and a split's partial last block with each lane reading its own column of a
// tile, a key past the split's last reading that key's row again (probability 0): what lies past
// the keys, a NaN perhaps, never reaches a product. Legend: r = the group's rows (M per row
// tile), d / dv = head dims, n = keys of a tile (the sub-group's lanes).
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/block_schedule.hpp"
#include "common/kernel_props.hpp"
#include "common/kv_quant.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "common/seq_info.hpp"
#include "decode/append.hpp"
#include "decode/merge_kernel.hpp"
#include "decode/params.hpp"
#include "decode/row_scores.hpp"
#include "decode/rows.hpp"
#include "decode/traits.hpp"
#include "decode/xmx_output.hpp"
#include "decode/xmx_tiles.hpp"
#include "matrix/row_tiles.hpp"
#include "score/block_mask.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// FEATURES: softcap, ALiBi, the user's mask (decode/row_scores.hpp), the append and its rotary
// embedding, an FP8 cache (its tiles converted in registers: decode/xmx_tiles.hpp). HEAD_DIM_V:
// V's and O's head dim (MLA's 512 latent columns of its 576-column K rows). SUBGROUPS: where O
// would pass 64 registers in one sub-group (take_xmx_form, host/variants/decode_variant.cpp);
// the rows' block maxima and sums meet in SLM.
template <typename T, int HEAD_DIM, int ROWS, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N, int HEAD_DIM_V = HEAD_DIM, int SUBGROUPS = 1>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<MATRIX_N>))
IPEX_FLASH_REGISTER_FILE
void flash_decode_xmx_kernel(DecodeParams p) {
  constexpr int M = MATRIX_M, K = MATRIX_K, N = MATRIX_N, G = SUBGROUPS;
  constexpr int ROW_TILES = ROWS / M, KEY_TILES = BLOCK_N / N, MY_KEY_TILES = KEY_TILES / G;
  constexpr int D_STEPS = HEAD_DIM / K, O_COLS = HEAD_DIM_V / G, O_TILES = O_COLS / N;
  // Q's A tiles stay in registers up to 32 of them (8 tiles of 8 x 16); beyond, S, P and O
  // take the registers and Q is read from SLM per block.
  constexpr bool Q_IN_REGISTERS = ROW_TILES * HEAD_DIM <= 128;
  static_assert(ROWS % M == 0 && ROWS <= N && BLOCK_N % (N * G) == 0 && HEAD_DIM % K == 0 &&
                    HEAD_DIM_V % (N * G) == 0 && K == N && N == DECODE_LANES &&
                    sizeof(T) == 2 && KEY_TILES >= 2,
                "tile shape");
  static_assert((FEATURES & ~(FEATURE_SOFTCAP | FEATURE_ALIBI | FEATURE_ATTN_MASK |
                              FEATURE_APPEND | FEATURE_ROTARY | FEATURE_VALUE_DIM |
                              FEATURE_KV_FP8)) == 0,
                "features this form serves");
  // The cache's elements: T, or FP8 read lane by lane into half tiles (TT), bfloat16 queries'
  // rows scaled into a half's range (SCALED_Q: decode_stage_queries_in_half).
  using KV = kv_storage_t<T, FEATURES>;
  constexpr bool FP8 = sizeof(KV) == 1, SCALED_Q = FP8 && !std::is_same_v<T, sycl::half>;
  using TT = std::conditional_t<FP8, sycl::half, T>;
  // O's columns in groups of four tiles, V's rows read a word per lane (value_column)
  constexpr bool COLUMN_WORDS = FP8 && O_COLS % (4 * N) == 0;
  using Shape = DecodeXmxShape<T, FEATURES>;
  using Acc = MatrixAcc<M, N>;
  using QTile = RowsA<TT, M, K>;
  // Q, then at the end O's rows (one row tile at a time, as float) in the same bytes; P of a key
  // block on its way from S's accumulators to A tiles (an accumulator's elements copied into an
  // A tile one by one, joint_matrix_copy, went through private memory on BMG: 74 KB, 160k
  // instructions a block); the sub-groups' block maxima and sums; the rows' output scales.
  using Staging = DecodeXmxStaging<TT, ROWS, HEAD_DIM, M, HEAD_DIM_V>;
  static syclexp::work_group_static<Staging> staging_slm;
  static syclexp::work_group_static<TT[ROWS][BLOCK_N]> p_slm;
  static syclexp::work_group_static<float[G][ROWS]> meet_slm;
  static syclexp::work_group_static<float[ROWS]> scale_slm;
  static syclexp::work_group_static<float[SCALED_Q ? ROWS : 1]> q_unit_slm;  // (SCALED_Q)
  Staging& staging = staging_slm;
  TT(&q_rows)[ROWS][HEAD_DIM] = staging.q;
  TT(&p_rows)[ROWS][BLOCK_N] = p_slm;
  float(&meet)[G][ROWS] = meet_slm;
  float(&row_scale)[ROWS] = scale_slm;
  float(&q_unit)[SCALED_Q ? ROWS : 1] = q_unit_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const sycl::group<1> group = item.get_group();
  const sycl::sub_group sg = item.get_sub_group();
  const int lid = static_cast<int>(sg.get_local_linear_id());      // lane: a tile's column
  const int sg_id = G == 1 ? 0 : static_cast<int>(sg.get_group_linear_id());
  const int local_id = sg_id * N + lid;
  const auto barrier = [&]() __attribute__((always_inline)) {
    G == 1 ? sycl::group_barrier(sg) : sycl::group_barrier(group);
  };
  const int heads_kv = c.dims.heads_kv();
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), c.num_blocks,
                                       heads_kv * p.row_slices, /*reverse_blocks=*/false);
  const int b = coord.batch, split = coord.block;
  const int h_kv = coord.head / p.row_slices;
  const SeqInfo seq = bounded_seq_info(c, p.bounds, b);
  const int row0 = coord.head % p.row_slices * ROWS;
  const DecodeRows rows{p, seq, b, h_kv, row0, c.dims.heads_per_kv * seq.len_q - row0};
  if (rows.count <= 0) return;  // past a shorter sequence's rows
  const int head_dim = c.dims.head_dim, head_dim_v = c.dims.head_dim_v;
  const BlockMask mask = BlockMask::of(c.mask, seq);
  const int64_t split_begin = static_cast<int64_t>(split) * p.split_keys;
  const int64_t kv_first = std::max<int64_t>(split_begin, mask.first_key(0) / BLOCK_N * BLOCK_N);
  const bool in_pool = split_pages_in_pool(
      sg, c, p.bounds, b, split_begin, std::min<int64_t>(split_begin + p.split_keys, seq.len_k));
  const int64_t kv_end =
      in_pool ? std::min<int64_t>(split_begin + p.split_keys, mask.end_key(seq.len_q)) : kv_first;
  const KvRows<KV> k_rows = kv_rows<KV>(p.k, p.k_stride, c, seq, b, h_kv);
  const KvRows<KV> v_rows = kv_rows<KV>(p.v, p.v_stride, c, seq, b, h_kv);
  const KvDescale descale = kv_descale<FEATURES>(c, b, h_kv);  // 1 but for FP8 caches

  if constexpr ((FEATURES & FEATURE_APPEND) != 0) {
    if (sg_id == 0)
      decode_append<Shape>(p, seq, DecodeColumns{head_dim, head_dim_v, true, true}, b, h_kv, 1,
                           split_begin, lid);
    sycl::group_barrier(group);  // the new rows written before any lane reads them
  }
  // Q of the group's rows into SLM, the work-group's items along d (decode/rows.hpp).
  if constexpr (SCALED_Q)
    decode_stage_queries_in_half<Shape>(group, sg, sg_id, rows, q_rows, q_unit, meet, head_dim,
                                        local_id, G * N);
  else
    decode_stage_queries<Shape, FP8>(rows, q_rows, head_dim, local_id, G * N);
  sycl::group_barrier(group);
  const DecodeRowScores<FEATURES, SCALED_Q> row_scores = DecodeRowScores<FEATURES, SCALED_Q>::of(
      c, rows, h_kv, ROWS, lid,
      descale.k * FP8_WORD_UNIT<KV> * (SCALED_Q ? q_unit[std::min(lid, ROWS - 1)] : 1.f));
  QTile q_tiles[Q_IN_REGISTERS ? ROW_TILES * D_STEPS : 2];
  if constexpr (Q_IN_REGISTERS) {
IPEX_FLASH_TILE_LOOP
    for (int rt = 0; rt < ROW_TILES; ++rt)
IPEX_FLASH_TILE_LOOP
      for (int s = 0; s < D_STEPS; ++s)
        rows_a_load(sg, q_tiles[rt * D_STEPS + s], &q_rows[rt * M][s * K], HEAD_DIM);
  }

  Acc o[ROW_TILES][O_TILES];  // this sub-group's columns of O (o_col0 + value_column(j, lane))
  const int o_col0 = sg_id * O_COLS;
  rows_fill(sg, o, 0.f);
  // The running max of row r in lane r (the same in every sub-group; rows_max_into_lanes), and
  // per row this lane's share of the sum over its sub-group's keys.
  float max_lanes = NEG_INF;
  float lane_sum[ROW_TILES][M] = {};
  // Tiles straight from the cache where a tile's 16 rows are evenly spaced (no pages, or pages
  // of whole tiles) and whole (the compiled head dims).
  const bool in_place = head_dim == HEAD_DIM && head_dim_v == HEAD_DIM_V &&
                        (c.seq.block_table == nullptr || c.seq.page_size % N == 0);

  // Row `key` of the tile of keys from key0 (`tile`: its first row), clamped to the split's last
  // key: a partial tile's missing keys read that row again (finite, their probabilities 0), never
  // what lies past the keys. The tile's rows are evenly spaced where in_place holds.
  const int64_t last_key = kv_end - 1;
  const auto tile_row = [&](const KvRows<KV>& rows_of, const KV* tile, int64_t key0, int64_t key)
      __attribute__((always_inline)) {
    const int64_t clamped = std::min(key, last_key);
    if (!in_place || key0 > last_key) return rows_of.row(clamped);
    return tile + (clamped - key0) * rows_of.row_stride;
  };
  const auto kv_block = [&](auto general, int64_t kv_begin) __attribute__((always_inline)) {
    constexpr bool GENERAL = decltype(general)::value;
    // The reduction over d unrolled this far where Q comes from SLM (its steps then index no
    // register array)
    constexpr int STEP_UNROLL = Q_IN_REGISTERS ? D_STEPS : 4;
    // The first K rows of this sub-group's key tiles and the first V rows of every key tile,
    // found once a block (a tile past the keys: the last key's, which tile_row reads instead);
    // the general form finds its V tiles' where it reads them (an array of 16 of them, indexed
    // in its loop over the tiles, which IGC left rolled, went to private memory).
    const int64_t my_begin = kv_begin + sg_id * MY_KEY_TILES * N;
    const KV* k_tiles[MY_KEY_TILES];
    const KV* v_tiles[GENERAL ? 1 : KEY_TILES];
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < MY_KEY_TILES; ++t)
      k_tiles[t] = k_rows.row(std::min(my_begin + t * N, last_key));
    if constexpr (!GENERAL) {
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < KEY_TILES; ++t) v_tiles[t] = v_rows.row(kv_begin + t * N);
    }
    // S = Q . K^T over this sub-group's key tiles, one K^T tile per key tile and reduction
    // step for every row tile.
    Acc s[ROW_TILES][MY_KEY_TILES];
IPEX_FLASH_TILE_LOOP
    for (int rt = 0; rt < ROW_TILES; ++rt)
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < MY_KEY_TILES; ++t) matrix_fill(sg, s[rt][t], 0.f);
IPEX_FLASH_STEP_LOOP(STEP_UNROLL)
    for (int step = 0; step < D_STEPS; ++step) {
      QTile q_step[Q_IN_REGISTERS ? 2 : ROW_TILES * 2];  // (arrays of one tile: see registers_xmx)
      if constexpr (!Q_IN_REGISTERS) {
IPEX_FLASH_TILE_LOOP
        for (int rt = 0; rt < ROW_TILES; ++rt)
          rows_a_load(sg, q_step[rt], &q_rows[rt * M][step * K], HEAD_DIM);
      }
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < MY_KEY_TILES; ++t) {
        const int64_t key0 = my_begin + t * N;
        const auto product = [&](auto& k_t) __attribute__((always_inline)) {
IPEX_FLASH_TILE_LOOP
          for (int rt = 0; rt < ROW_TILES; ++rt) {
            if constexpr (Q_IN_REGISTERS)
              rows_mad(sg, s[rt][t], q_tiles[rt * D_STEPS + step], k_t);
            else
              rows_mad(sg, s[rt][t], q_step[rt], k_t);
          }
        };
        // (lane by lane: lane n reads key key0 + n's columns, clamped)
        keys_tile_product<TT, K, N, GENERAL || FP8>(
            sg, k_tiles[t] + step * K, k_rows.row_stride,
            (GENERAL ? tile_row(k_rows, k_tiles[t], key0, key0 + lid)
                     : k_tiles[t] + lid * k_rows.row_stride) + step * K,
            product);
      }
    }

    // Scores, the online softmax (the block max over the sub-groups' keys), P; O rescaled,
    // then O += P . V tile by tile.
    const auto score_block = row_scores.at(kv_begin);
    float block_lanes = NEG_INF;  // lane r: row r's max over the block's keys
IPEX_FLASH_TILE_LOOP
    for (int rt = 0; rt < ROW_TILES; ++rt) {
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < MY_KEY_TILES; ++t)
        row_scores.template apply_tile<GENERAL, M>(sg, s[rt][t], score_block, rt,
                                                   my_begin + t * N + lid, kv_begin, kv_end,
                                                   rows, mask);
      rows_max_into_lanes<M>(sg, s[rt], rt * M, block_lanes);
    }
    if constexpr (G > 1) {  // every sub-group's maxima, then the block's
      if (lid < ROWS) meet[sg_id][lid] = block_lanes;
      sycl::group_barrier(group);
      if (lid < ROWS) {
IPEX_FLASH_TILE_LOOP
        for (int g = 0; g < G; ++g) block_lanes = sycl::fmax(block_lanes, meet[g][lid]);
      }
    }
    const float new_max = sycl::fmax(max_lanes, block_lanes);
    const float base_lanes = OnlineSoftmaxRow::exp_base(new_max);
    const float factor_lanes = sycl::exp2(max_lanes - base_lanes);
    max_lanes = new_max;
IPEX_FLASH_TILE_LOOP
    for (int rt = 0; rt < ROW_TILES; ++rt) {
IPEX_FLASH_TILE_LOOP
      for (int i = 0; i < M; ++i) lane_sum[rt][i] *= from_lane(sg, factor_lanes, rt * M + i);
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < MY_KEY_TILES; ++t) {
        float column[M];
        matrix_acc_column(sg, s[rt][t], column);
IPEX_FLASH_TILE_LOOP
        for (int i = 0; i < M; ++i) {
          const float prob = sycl::exp2(column[i] - from_lane(sg, base_lanes, rt * M + i));
          lane_sum[rt][i] += prob;
          p_rows[rt * M + i][(sg_id * MY_KEY_TILES + t) * N + lid] = from_float<TT>(prob);
        }
      }
IPEX_FLASH_TILE_LOOP
      for (int j = 0; j < O_TILES; ++j) row_scale_tile<M>(sg, o[rt][j], factor_lanes, rt * M);
    }
    barrier();  // P written (and the maxima read)
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < KEY_TILES; ++t) {
      const int64_t key0 = kv_begin + t * N;
      QTile p_tiles[ROW_TILES * 2];  // (arrays of one tile: see registers_xmx)
      const KV* v_tile[GENERAL ? K : 1];  // the tile's V rows, clamped
      if constexpr (GENERAL) {
IPEX_FLASH_TILE_LOOP
        for (int i = 0; i < K; ++i) v_tile[i] = v_rows.row(std::min(key0 + i, last_key));
      }
IPEX_FLASH_TILE_LOOP
      for (int rt = 0; rt < ROW_TILES; ++rt)
        rows_a_load(sg, p_tiles[rt], &p_rows[rt * M][t * N], BLOCK_N);
      const auto row_of = [&](int i) __attribute__((always_inline)) {
        return GENERAL ? v_tile[i] : v_tiles[t] + i * v_rows.row_stride;
      };
      for_value_tiles<TT, K, N, O_TILES, GENERAL || FP8, COLUMN_WORDS, COLUMN_WORDS && !GENERAL>(
          sg, v_tiles[t] + o_col0, v_rows.row_stride, row_of, o_col0,
          GENERAL ? static_cast<int>(std::min<int64_t>(K, last_key - key0 + 1)) : K, lid,
          [&](int j, auto& v_t) __attribute__((always_inline)) {
IPEX_FLASH_TILE_LOOP
            for (int rt = 0; rt < ROW_TILES; ++rt) rows_mad(sg, o[rt][j], p_tiles[rt], v_t);
          });
    }
    barrier();  // P read before the next block writes it
  };
  // Rows span every new token: the mask's run is the one all of them see whole. Split with score
  // changes too: the general form is also the lane-by-lane reads (9x the loop, BMG d = 64).
  const BlockRun lean = in_place ? mask.fully_visible_key_blocks(0, seq.len_q, kv_first, kv_end,
                                                                 BLOCK_N)
                                 : BlockRun::none(kv_first);
  run_blocks</*SPLIT=*/true>(kv_first, kv_end, BLOCK_N, lean, kv_block);

  // Each row's sum, LSE and output (decode/xmx_output.hpp).
  const DecodeXmxOutput<T, ROWS, M, G, HEAD_DIM_V> output{
      rows, split, DECODE_ONE_SPLIT_WRITES && c.num_blocks == 1, descale.v * FP8_WORD_UNIT<KV>,
      staging.o, meet, row_scale, group, sg, sg_id, lid};
  output.template write<Acc, ROW_TILES, O_TILES, N, COLUMN_WORDS>(o, lane_sum, max_lanes, o_col0,
                                                                  head_dim_v);
}

}  // namespace ipex_flash
