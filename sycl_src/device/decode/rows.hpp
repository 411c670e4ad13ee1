// The query rows of a decode work-group (decode/kernel.hpp): which query head and new token
// each row is, and their Q and running state put into local memory before the keys. (The
// partial results stay in the kernel: as a function here, taking the local memory by
// reference, they made Arc A, Meteor Lake and Arrow Lake-H spill in the bf16 d=64 one-row
// decode, past its rule; gpu-check's record.) Dimension legend as in decode/traits.hpp.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "decode/merge_kernel.hpp"
#include "decode/traits.hpp"
#include "common/dtypes.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "decode/params.hpp"
#include "kvcache/params.hpp"
#include "kvcache/rotary.hpp"
#include "common/seq_info.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

// Rows row0 .. row0 + GROUP_ROWS - 1 of the heads_per_kv x Nq rows of each of the group's K/V
// heads (more rows than lanes are served in slices, a work-group each): row r of K/V head h_kv
// is query head h_kv * heads_per_kv + (row0 + r) / Nq, new token (row0 + r) % Nq.
struct DecodeRows {
  const DecodeParams& p;
  const SeqInfo& seq;
  int b;
  int head0;  // the group's first K/V head
  int row0;
  int count;  // rows from row0 (beyond GROUP_ROWS: later slices')

  int query_head(int h_kv, int r) const {
    return h_kv * p.common.dims.heads_per_kv + (row0 + r) / seq.len_q;
  }
  int token(int r) const { return (row0 + r) % seq.len_q; }
  // Element d of Q row r (`row`: rows.q), rotated first with FEATURE_ROTARY (kvcache/rotary.hpp).
  template <class Tr>
  typename Tr::T q_element(const typename Tr::T* row, int r, int d) const {
    if constexpr (Tr::ROTARY) {
      const RotaryParams& rotary = p.rotary;
      const int64_t position =
          p.common.seq.seqlens_k[b] + (rotary.q_positions_advance ? token(r) : 0);
      return rotated_element<typename Tr::T, typename Tr::Cos>(rotary, row, d, position);
    }
    return row[d];
  }
  // Row r of the group's K/V head hk in (B, Hq, Nq) order, as the partial buffers index rows.
  int64_t index(int hk, int r) const {
    const AttentionDims& dims = p.common.dims;
    return (static_cast<int64_t>(b) * dims.heads_q + query_head(head0 + hk, r)) * dims.len_q +
           token(r);
  }
  // Q row r of the group's K/V head hk (a padding row reads the group's first row instead).
  template <typename T>
  const T* q(int hk, int r, bool ok) const {
    return static_cast<const T*>(p.q) + b * p.q_stride.batch +
           query_head(head0 + (ok ? hk : 0), ok ? r : 0) * p.q_stride.head +
           (seq.q_row0 + (ok ? token(r) : 0)) * p.q_stride.row;
  }
};

// The rows' state in local memory: Q (* prescale) and O in vector order (i = vi * LANES +
// lane, column Row::column(vi, lane)), each head's running softmax per lane (lane = row *
// KEYS_PER_STEP + key), and for matrix scores Q^T packed per head set (word [d / 2][column],
// column = head in set * GROUP_ROWS + r).
template <class Tr>
struct DecodeRowState {
  float (&q)[Tr::MAX_HEADS][Tr::GROUP_ROWS][Tr::HEAD_DIM];
  float (&acc)[Tr::MAX_HEADS][Tr::GROUP_ROWS][Tr::HEAD_DIM];
  float (&row_max)[Tr::MAX_HEADS][Tr::LANES];
  float (&row_sum)[Tr::MAX_HEADS][Tr::LANES];
  uint32_t (&q_t)[Tr::MATRIX_SETS][Tr::HEAD_DIM / 2][Tr::LANES];
};

// Q of every row into local memory (as Q^T for matrix scores), O and the running softmax
// reset. Ends with a barrier.
template <class Tr>
inline void decode_load_queries(sycl::group<1> group, const DecodeRows& rows, int group_heads,
                                int head_dim, int lid, const DecodeRowState<Tr>& state) {
  using T = typename Tr::T;
  using Row = typename Tr::Row;
  constexpr int LANES = Tr::LANES, GROUP_ROWS = Tr::GROUP_ROWS, HEAD_DIM = Tr::HEAD_DIM;
  for (int hk = 0; hk < group_heads; ++hk) {
    for (int r = 0; r < GROUP_ROWS; ++r) {  // lanes along d
      const bool row_ok = r < rows.count;
      const T* q = rows.q<T>(hk, r, row_ok);
      for (int i = lid; i < HEAD_DIM; i += LANES) {
        const int d = Row::column(i / LANES, lid);
        if constexpr (!Tr::MATRIX)
          state.q[hk][r][i] =
              row_ok && d < head_dim
                  ? rows.p.common.q_prescale * to_float(rows.q_element<Tr>(q, r, d))
                  : 0.f;
        state.acc[hk][r][i] = 0.f;
      }
    }
    const OnlineSoftmaxRow fresh;
    state.row_max[hk][lid] = fresh.row_max;
    state.row_sum[hk][lid] = fresh.row_sum;
  }
  if constexpr (Tr::MATRIX) {  // lane = column
    const int hk = lid / GROUP_ROWS, r = lid % GROUP_ROWS;
    for (int set = 0; set * Tr::HEADS_PER_SET < group_heads; ++set) {
      const bool col_ok = r < rows.count && set * Tr::HEADS_PER_SET + hk < group_heads;
      const T* q = rows.q<T>(set * Tr::HEADS_PER_SET + hk, r, col_ok);
      for (int d = 0; d < HEAD_DIM; d += 2)
        state.q_t[set][d / 2][lid] =
            pack_pair(col_ok && d < head_dim ? rows.q_element<Tr>(q, r, d) : tile_zero<T>(),
                      col_ok && d + 1 < head_dim ? rows.q_element<Tr>(q, r, d + 1)
                                                 : tile_zero<T>());
    }
  }
  sycl::group_barrier(group);
}

// The register form's (decode/xmx_kernel.hpp) local memory for its rows: Q of ROWS rows as T
// through the keys, then in the same bytes O of one row tile (M rows) at a time as float.
template <typename T, int ROWS, int HEAD_DIM, int M, int HEAD_DIM_V>
union DecodeXmxStaging {
  T q[ROWS][HEAD_DIM];
  float o[M][HEAD_DIM_V];
};

// Where column d of Q goes in the register form's staged rows: in place, or with PAIRED (an FP8
// cache's) columns 1 and 2 of every four swapped, the order in which decode/xmx_tiles.hpp pairs
// a K word's elements (0 and 2, 1 and 3: fp8_word_halves).
template <bool PAIRED>
inline int staged_column(int d) {
  return PAIRED ? (d & ~3) | (d & 1) << 1 | (d >> 1 & 1) : d;
}

// The register form's rows of one K/V head (rows.head0), staged and written by the work-group's
// `items` items along d (`item`: this one's). Q of ROWS rows into SLM as T, rotated with the
// append's rotary (Shape: DecodeXmxShape), columns placed by staged_column; padding rows and
// columns zero.
template <class Shape, bool PAIRED, int ROWS, int HEAD_DIM>
inline void decode_stage_queries(const DecodeRows& rows,
                                 typename Shape::T (&q_rows)[ROWS][HEAD_DIM], int head_dim,
                                 int item, int items) {
  using T = typename Shape::T;
  for (int r = 0; r < ROWS; ++r) {
    const bool row_ok = r < rows.count;
    const T* q = rows.q<T>(0, r, row_ok);
    for (int d = item; d < HEAD_DIM; d += items)
      q_rows[r][staged_column<PAIRED>(d)] =
          row_ok && d < head_dim ? rows.q_element<Shape>(q, r, d) : tile_zero<T>();
  }
}

// The same, PAIRED, into half tiles from bfloat16 queries (an FP8 cache's: xmx_tiles.hpp), each
// row times the power of two 2^s that brings its largest magnitude into [2^13, 2^14): there a
// half holds every bfloat16 element exactly down to 2^-27 of the largest (the rest keep 2^-24 of
// absolute precision), where one unscaled would overflow past 65504. row_unit[r] = 2^-s, what
// the row's scores are in (1 for a row of zeros, infinities or NaNs). The sub-groups' maxima
// meet in `meet` (a work-group reduction took 4 KiB of SLM of its own on BMG and PVC).
template <class Shape, int ROWS, int HEAD_DIM, int G>
inline void decode_stage_queries_in_half(sycl::group<1> group, sycl::sub_group sg, int sg_id,
                                         const DecodeRows& rows,
                                         sycl::half (&q_rows)[ROWS][HEAD_DIM],
                                         float (&row_unit)[ROWS], float (&meet)[G][ROWS],
                                         int head_dim, int item, int items) {
  using T = typename Shape::T;
  for (int r = 0; r < ROWS; ++r) {
    const bool row_ok = r < rows.count;
    const T* q = rows.q<T>(0, r, row_ok);
    float largest = 0.f;
    for (int d = item; row_ok && d < head_dim; d += items)
      largest = sycl::fmax(largest, sycl::fabs(to_float(rows.q_element<Shape>(q, r, d))));
    largest = sycl::reduce_over_group(sg, largest, sycl::maximum<float>());
    if (sg.get_local_linear_id() == 0) meet[sg_id][r] = largest;
  }
  sycl::group_barrier(group);
  for (int r = 0; r < ROWS; ++r) {
    const bool row_ok = r < rows.count;
    const T* q = rows.q<T>(0, r, row_ok);
    float largest = meet[0][r];
    for (int g = 1; g < G; ++g) largest = sycl::fmax(largest, meet[g][r]);
    // largest's binary exponent (largest = m * 2^e, m in [1, 2)), the shift held to +-100
    const int e = static_cast<int>((sycl::bit_cast<uint32_t>(largest) >> 23) & 0xffu) - 127;
    const int shift =
        largest > 0.f && sycl::isfinite(largest) ? sycl::clamp(13 - e, -100, 100) : 0;
    for (int d = item; d < HEAD_DIM; d += items)
      q_rows[r][staged_column<true>(d)] =
          row_ok && d < head_dim
              ? static_cast<sycl::half>(
                    sycl::ldexp(to_float(rows.q_element<Shape>(q, r, d)), shift))
              : sycl::half(0.f);
    if (item == 0) row_unit[r] = sycl::ldexp(1.f, -shift);
  }
}

// Row r's softmax done: its LSE written (with one split, the sinks' share folded in, as the
// merge does it: decode/merge_kernel.hpp), and the factor of its output returned.
inline float decode_row_finish(const DecodeRows& rows, int split, bool one_split, int r,
                               const OnlineSoftmaxRow& row, int lid) {
  const AttentionCommon& c = rows.p.common;
  const bool valid = r < rows.count;
  const float lse = row.log2_sum_exp();
  float scale = row.inverse_sum();
  if (one_split) {
    const int h = rows.query_head(rows.head0, valid ? r : 0);
    const SplitShare total = split_share(c.score_mod.sinks, h, lse);
    scale *= total.share;
    if (valid && lid == 0) rows.p.lse[lse_index(c, rows.seq, rows.b, h, rows.token(r))] = total.lse;
  } else if (valid && lid == 0) {
    rows.p.partial_lse[rows.index(0, r) * c.num_blocks + split] = lse;
  }
  return scale;
}

// Where column d of O lies in a row tile stored in groups of WORD_GROUP columns (or as it is).
template <int WORD_GROUP>
inline int stored_column(int d) {
  if constexpr (WORD_GROUP == 0) return d;
  constexpr int N = WORD_GROUP / 4;
  return d / WORD_GROUP * WORD_GROUP + d % 4 * N + d % WORD_GROUP / 4;
}

// Rows r0 .. r0 + M - 1's outputs (O's row tile in SLM times each row's factor): into out with
// one split, else into the split's partial buffer; the work-group's `items` items along d.
// WORD_GROUP > 0: the tile holds its columns in groups of WORD_GROUP (4 tiles of N), column
// 4n + u of a group at u * N + n (decode/xmx_tiles.hpp: value_column).
template <typename T, int M, int HEAD_DIM_V, int ROWS, int WORD_GROUP = 0>
inline void decode_write_rows(const DecodeRows& rows, int split, bool one_split, int r0,
                              const float (&o_rows)[M][HEAD_DIM_V], const float (&scale)[ROWS],
                              int head_dim_v, int item, int items) {
  const DecodeParams& p = rows.p;
  for (int i = 0; i < M && r0 + i < rows.count; ++i) {
    const int r = r0 + i;
    if (one_split) {
      T* out = static_cast<T*>(p.out) + rows.b * p.out_stride.batch +
               rows.query_head(rows.head0, r) * p.out_stride.head +
               rows.token(r) * p.out_stride.row;
      for (int d = item; d < head_dim_v; d += items)
        out[d] = from_float<T>(o_rows[i][stored_column<WORD_GROUP>(d)] * scale[r]);
    } else {
      float* partial =
          p.partial_out + (rows.index(0, r) * p.common.num_blocks + split) * head_dim_v;
      for (int d = item; d < head_dim_v; d += items)
        partial[d] = o_rows[i][stored_column<WORD_GROUP>(d)] * scale[r];
    }
  }
}

}  // namespace ipex_flash
