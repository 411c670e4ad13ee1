// Decoding on the matrix engine with every tile in registers: the decode kernel's form for the
// 16-wide XMX GPUs (PVC, BMG, Lunar Lake) and 16-bit caches, in sycl-tla's orientation
// (matrix/row_tiles.hpp). The query rows of one K/V head (GQA group x new tokens, 8 or 16:
// ROWS) are the DPAS tiles' M rows, so each K/V element read feeds all of them on XMX:
//   S (rows, keys) = Q (rows, d) . K^T (d, keys)    K^T's tiles loaded from K's rows in place
//   online softmax per row                         row max over the sub-group, sums per lane
//   O (rows, dv) = rescale * O + P (rows, keys) . V (keys, dv)   V's tiles from its rows
// Q is staged once in SLM and read as A tiles (in registers where they fit); S and O stay in
// registers through the keys; P goes to A tiles through SLM, O through SLM once at the end
// (what IGC made of the other forms: docs/matrix_kernels.md). A work-group is one sub-group per
// (batch, K/V head, split of the keys, slice of ROWS rows); a split writes its partial output and
// LSE for flash_decode_merge_kernel, or with one split the output (as decode/kernel.hpp does).
// Key blocks walk as the forward's (run_blocks): the fully visible ones in a loop of in-place
// loads without the mask's code; a window's edge and a split's partial last block with each
// lane reading its own column of a tile, a key past the split's last reading that key's row
// again (probability 0): what lies past the keys, a NaN perhaps, never reaches a product.
// Dimension legend: r = the group's rows (M per row tile), d / dv = head dims, n = keys of a
// tile (the sub-group's lanes).
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/block_schedule.hpp"
#include "common/kernel_props.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "common/seq_info.hpp"
#include "decode/append.hpp"
#include "decode/merge_kernel.hpp"
#include "decode/params.hpp"
#include "decode/row_scores.hpp"
#include "decode/rows.hpp"
#include "decode/traits.hpp"
#include "matrix/row_tiles.hpp"
#include "score/block_mask.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// FEATURES: softcap, ALiBi, the user's mask (decode/row_scores.hpp), the append and its rotary
// embedding (the host sends FP8 caches and MLA's value head dim to flash_decode_kernel).
template <typename T, int HEAD_DIM, int ROWS, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<MATRIX_N>))
IPEX_FLASH_REGISTER_FILE
void flash_decode_xmx_kernel(DecodeParams p) {
  constexpr int M = MATRIX_M, K = MATRIX_K, N = MATRIX_N;
  constexpr int ROW_TILES = ROWS / M, KEY_TILES = BLOCK_N / N;
  constexpr int D_STEPS = HEAD_DIM / K, O_TILES = HEAD_DIM / N;
  // Q's A tiles stay in registers up to 32 of them (8 tiles of 8 x 16); beyond, S, P and O
  // take the registers and Q is read from SLM per block.
  constexpr bool Q_IN_REGISTERS = ROW_TILES * HEAD_DIM <= 128;
  static_assert(ROWS % M == 0 && BLOCK_N % N == 0 && HEAD_DIM % K == 0 && HEAD_DIM % N == 0 &&
                    K == N && N == DECODE_LANES && sizeof(T) == 2 && KEY_TILES >= 2,
                "tile shape");
  static_assert((FEATURES & ~(FEATURE_SOFTCAP | FEATURE_ALIBI | FEATURE_ATTN_MASK |
                              FEATURE_APPEND | FEATURE_ROTARY)) == 0,
                "features this form serves");
  using Shape = DecodeXmxShape<T, FEATURES>;
  using Acc = MatrixAcc<M, N>;
  using QTile = RowsA<T, M, K>;
  // Q; P of a key block on its way from S's accumulators to A tiles (an accumulator's elements
  // copied into an A tile one by one, joint_matrix_copy, went through private memory on BMG:
  // 74 KB, 160k instructions a block); O and its rows' scales at the end.
  static syclexp::work_group_static<T[ROWS][HEAD_DIM]> q_slm;
  static syclexp::work_group_static<T[ROWS][BLOCK_N]> p_slm;
  static syclexp::work_group_static<float[ROWS][HEAD_DIM]> o_slm;
  static syclexp::work_group_static<float[ROWS]> scale_slm;
  T(&q_rows)[ROWS][HEAD_DIM] = q_slm;
  T(&p_rows)[ROWS][BLOCK_N] = p_slm;
  float(&o_rows)[ROWS][HEAD_DIM] = o_slm;
  float(&row_scale)[ROWS] = scale_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const sycl::sub_group sg = item.get_sub_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const int heads_kv = c.dims.heads_kv();
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), c.num_blocks,
                                       heads_kv * p.row_slices, /*reverse_blocks=*/false);
  const int b = coord.batch, split = coord.block;
  const int h_kv = coord.head / p.row_slices;
  const SeqInfo seq = bounded_seq_info(c, p.bounds, b);
  const int len_q = seq.len_q;
  const int row0 = coord.head % p.row_slices * ROWS;
  const DecodeRows rows{p, seq, b, h_kv, row0, c.dims.heads_per_kv * len_q - row0};
  if (rows.count <= 0) return;  // past a shorter sequence's rows
  const int head_dim = c.dims.head_dim;
  const BlockMask mask = BlockMask::of(c.mask, seq);
  const int64_t split_begin = static_cast<int64_t>(split) * p.split_keys;
  const int64_t kv_first = std::max<int64_t>(split_begin, mask.first_key(0) / BLOCK_N * BLOCK_N);
  const bool in_pool = split_pages_in_pool(
      sg, c, p.bounds, b, split_begin, std::min<int64_t>(split_begin + p.split_keys, seq.len_k));
  const int64_t kv_end =
      in_pool ? std::min<int64_t>(split_begin + p.split_keys, mask.end_key(len_q)) : kv_first;
  const KvRows<T> k_rows = kv_rows<T>(p.k, p.k_stride, c, seq, b, h_kv);
  const KvRows<T> v_rows = kv_rows<T>(p.v, p.v_stride, c, seq, b, h_kv);
  const DecodeRowScores<FEATURES> row_scores =
      DecodeRowScores<FEATURES>::of(c, rows, h_kv, ROWS, lid);

  if constexpr ((FEATURES & FEATURE_APPEND) != 0) {
    decode_append<Shape>(p, seq, DecodeColumns{head_dim, head_dim, true, true}, b, h_kv, 1,
                         split_begin, lid);
    sycl::group_barrier(item.get_group());  // the new rows written before any lane reads them
  }
  // Q of the group's rows into SLM (rotated with the append's rotary), lanes along d; padding
  // rows and columns zero.
  decode_stage_queries<Shape>(rows, q_rows, head_dim, lid);
  sycl::group_barrier(sg);
  QTile q_tiles[Q_IN_REGISTERS ? ROW_TILES * D_STEPS : 2];
  if constexpr (Q_IN_REGISTERS) {
IPEX_FLASH_TILE_LOOP
    for (int rt = 0; rt < ROW_TILES; ++rt)
IPEX_FLASH_TILE_LOOP
      for (int s = 0; s < D_STEPS; ++s)
        rows_a_load(sg, q_tiles[rt * D_STEPS + s], &q_rows[rt * M][s * K], HEAD_DIM);
  }

  Acc o[ROW_TILES][O_TILES];
IPEX_FLASH_TILE_LOOP
  for (int rt = 0; rt < ROW_TILES; ++rt)
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < O_TILES; ++t) matrix_fill(sg, o[rt][t], 0.f);
  // Per row: the running max (the same in every lane) and this lane's share of the sum.
  float row_max[ROW_TILES][M], lane_sum[ROW_TILES][M];
IPEX_FLASH_TILE_LOOP
  for (int rt = 0; rt < ROW_TILES; ++rt)
IPEX_FLASH_TILE_LOOP
    for (int i = 0; i < M; ++i) {
      row_max[rt][i] = NEG_INF;
      lane_sum[rt][i] = 0.f;
    }
  // Tiles straight from the cache where a tile's 16 rows are evenly spaced (no pages, or pages
  // of whole tiles) and whole (the compiled head dim).
  const bool in_place = head_dim == HEAD_DIM &&
                        (c.seq.block_table == nullptr || c.seq.page_size % N == 0);

  // Row `key` of the tile of keys from key0 (`tile`: its first row), clamped to the split's last
  // key: a partial tile's missing keys read that row again (finite, their probabilities 0), never
  // what lies past the keys. The tile's rows are evenly spaced where in_place holds.
  const int64_t last_key = kv_end - 1;
  const auto tile_row = [&](const KvRows<T>& rows_of, const T* tile, int64_t key0, int64_t key)
      __attribute__((always_inline)) {
    const int64_t clamped = std::min(key, last_key);
    if (!in_place || key0 > last_key) return rows_of.row(clamped);
    return tile + (clamped - key0) * rows_of.row_stride;
  };
  const auto kv_block = [&](auto general, int64_t kv_begin) __attribute__((always_inline)) {
    constexpr bool GENERAL = decltype(general)::value;
    // Each key tile's first K and V rows, found once a block (a tile past the keys: the last
    // key's, which tile_row reads instead).
    const T* k_tiles[KEY_TILES];
    const T* v_tiles[KEY_TILES];
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < KEY_TILES; ++t) {
      const int64_t key0 = std::min(kv_begin + t * N, last_key);
      k_tiles[t] = k_rows.row(key0);
      v_tiles[t] = v_rows.row(key0);
    }
    // S = Q . K^T, one K^T tile per key tile and reduction step for every row tile.
    Acc s[ROW_TILES][KEY_TILES];
IPEX_FLASH_TILE_LOOP
    for (int rt = 0; rt < ROW_TILES; ++rt)
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < KEY_TILES; ++t) matrix_fill(sg, s[rt][t], 0.f);
IPEX_FLASH_TILE_LOOP
    for (int step = 0; step < D_STEPS; ++step) {
      QTile q_step[Q_IN_REGISTERS ? 2 : ROW_TILES * 2];  // (arrays of one tile: see registers_xmx)
      if constexpr (!Q_IN_REGISTERS) {
IPEX_FLASH_TILE_LOOP
        for (int rt = 0; rt < ROW_TILES; ++rt)
          rows_a_load(sg, q_step[rt], &q_rows[rt * M][step * K], HEAD_DIM);
      }
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < KEY_TILES; ++t) {
        const int64_t key0 = kv_begin + t * N;
        const auto product = [&](auto& k_t) __attribute__((always_inline)) {
IPEX_FLASH_TILE_LOOP
          for (int rt = 0; rt < ROW_TILES; ++rt) {
            if constexpr (Q_IN_REGISTERS)
              rows_mad(sg, s[rt][t], q_tiles[rt * D_STEPS + step], k_t);
            else
              rows_mad(sg, s[rt][t], q_step[rt], k_t);
          }
        };
        if constexpr (GENERAL) {  // lane n reads key key0 + n's columns (clamped)
          const T* row = tile_row(k_rows, k_tiles[t], key0, key0 + lid);
          float column[K];
IPEX_FLASH_TILE_LOOP
          for (int i = 0; i < K; ++i) column[i] = to_float(row[step * K + i]);
          MatrixBRegisters<T, K, N> k_t;
          matrix_b_from_floats<K, T>(sg, k_t, column);
          product(k_t);
        } else {
          KeysB<T, K, N> k_t;
          keys_b_load(sg, k_t, k_tiles[t] + step * K, k_rows.row_stride);
          product(k_t);
        }
      }
    }

    // Scores, the online softmax, P; O rescaled, then O += P . V tile by tile.
    const typename DecodeRowScores<FEATURES>::Block score_block = row_scores.at(kv_begin);
    float factor[ROW_TILES][M];
IPEX_FLASH_TILE_LOOP
    for (int rt = 0; rt < ROW_TILES; ++rt) {
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < KEY_TILES; ++t) {
        float column[M];  // rows of this lane's key
        matrix_acc_column(sg, s[rt][t], column);
        const int64_t key = kv_begin + t * N + lid;
        // (a key past the split's last reads the last's mask element; hidden below)
        const int key_in_block =
            GENERAL ? static_cast<int>(std::min(key, last_key) - kv_begin) : t * N + lid;
        row_scores.template apply<M>(sg, column, score_block, rt, key_in_block);
        if constexpr (GENERAL) {
IPEX_FLASH_TILE_LOOP
          for (int i = 0; i < M; ++i) {
            const int r = rt * M + i;
            if (r >= rows.count || key >= kv_end || !mask.visible(rows.token(r), key))
              column[i] = NEG_INF;
          }
        }
        matrix_acc_set_column(sg, s[rt][t], column);
      }
      float block_max[M];
      rows_max<M>(sg, s[rt], block_max);
IPEX_FLASH_TILE_LOOP
      for (int i = 0; i < M; ++i) {
        OnlineSoftmaxRow row{row_max[rt][i], lane_sum[rt][i]};
        factor[rt][i] = row.raise_max(block_max[i]);
        row_max[rt][i] = row.row_max;
        lane_sum[rt][i] = row.row_sum;
      }
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < KEY_TILES; ++t) {
        float column[M];
        matrix_acc_column(sg, s[rt][t], column);
IPEX_FLASH_TILE_LOOP
        for (int i = 0; i < M; ++i) {
          const float prob = sycl::exp2(column[i] - OnlineSoftmaxRow::exp_base(row_max[rt][i]));
          lane_sum[rt][i] += prob;
          p_rows[rt * M + i][t * N + lid] = from_float<T>(prob);
        }
      }
IPEX_FLASH_TILE_LOOP
      for (int j = 0; j < O_TILES; ++j) row_scale_tile<M>(sg, o[rt][j], factor[rt]);
    }
    sycl::group_barrier(sg);  // P written
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < KEY_TILES; ++t) {
      const int64_t key0 = kv_begin + t * N;
      QTile p_tiles[ROW_TILES * 2];  // (arrays of one tile: see registers_xmx)
      const T* v_tile[GENERAL ? K : 1];  // the tile's V rows, clamped
      if constexpr (GENERAL) {
IPEX_FLASH_TILE_LOOP
        for (int i = 0; i < K; ++i) v_tile[i] = tile_row(v_rows, v_tiles[t], key0, key0 + i);
      }
IPEX_FLASH_TILE_LOOP
      for (int rt = 0; rt < ROW_TILES; ++rt)
        rows_a_load(sg, p_tiles[rt], &p_rows[rt * M][t * N], BLOCK_N);
IPEX_FLASH_TILE_LOOP
      for (int j = 0; j < O_TILES; ++j) {
        const auto product = [&](auto& v_t) __attribute__((always_inline)) {
IPEX_FLASH_TILE_LOOP
          for (int rt = 0; rt < ROW_TILES; ++rt) rows_mad(sg, o[rt][j], p_tiles[rt], v_t);
        };
        if constexpr (GENERAL) {  // lane n reads column j * N + n of each key (clamped)
          float column[K];
IPEX_FLASH_TILE_LOOP
          for (int i = 0; i < K; ++i) column[i] = to_float(v_tile[i][j * N + lid]);
          MatrixBRegisters<T, K, N> v_t;
          matrix_b_from_floats<K, T>(sg, v_t, column);
          product(v_t);
        } else {
          ValuesB<T, K, N> v_t;
          values_b_load(sg, v_t, v_tiles[t] + j * N, v_rows.row_stride);
          product(v_t);
        }
      }
    }
    sycl::group_barrier(sg);  // P read before the next block writes it
  };
  // Rows span every new token: the mask's run is the one all of them see whole. Split with
  // score changes too, unlike the forward (split_blocks): here the general form is also the
  // lane-by-lane K/V reads, which cost the loop 9x its instructions (gpu-check, BMG d = 64),
  // and the changes' code is the same in both forms (decode/row_scores.hpp).
  const BlockRun lean = in_place ? mask.fully_visible_key_blocks(0, len_q, kv_first, kv_end,
                                                                 BLOCK_N)
                                 : BlockRun::none(kv_first);
  run_blocks</*SPLIT=*/true>(kv_first, kv_end, BLOCK_N, lean, kv_block);

  // Each row's sum over the lanes, and O / sum (and the sinks' share with one split) into out,
  // or into the split's partial buffers: O through SLM, read back a row at a time (the
  // accumulators' elements read in place made IGC keep O in private memory).
  const bool one_split = DECODE_ONE_SPLIT_WRITES && c.num_blocks == 1;
IPEX_FLASH_TILE_LOOP
  for (int rt = 0; rt < ROW_TILES; ++rt) {
IPEX_FLASH_TILE_LOOP
    for (int j = 0; j < O_TILES; ++j)
      matrix_store_acc(sg, o[rt][j], &o_rows[rt * M][j * N], HEAD_DIM);
IPEX_FLASH_TILE_LOOP
    for (int i = 0; i < M; ++i) {
      const OnlineSoftmaxRow row{
          row_max[rt][i], sycl::reduce_over_group(sg, lane_sum[rt][i], sycl::plus<float>())};
      const float scale = decode_row_finish(rows, split, one_split, rt * M + i, row, lid);
      if (lid == 0) row_scale[rt * M + i] = scale;
    }
  }
  sycl::group_barrier(sg);
  decode_write_rows<T>(rows, split, one_split, o_rows, row_scale, head_dim, lid);
}

}  // namespace ipex_flash
