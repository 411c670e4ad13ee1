// Decoding: attention of a few new query rows per sequence against a (possibly paged) KV
// cache. Memory-bound, so it is organised around reading each K/V element once:
//   one work-group per (batch, K/V head, split of the keys), serving all ROWS query rows of
//   the GQA group (heads_per_kv heads x Nq new tokens); the keys are split across work-groups
//   so that a few long sequences still fill the device;
//   per K/V block: scores with one work-item per key (K transposed in SLM, query rows
//   broadcast), the online softmax with one work-item per row, then P.V with one work-item
//   per head-dim column: a reduction over keys on the vector units, not a matrix product;
//   each split writes its normalised partial output and LSE; flash_decode_merge_kernel
//   combines them: out = sum_s exp(lse_s - lse) * out_s, lse = log sum_s exp(lse_s).
// Dimension legend: r = query rows of the group (ROWS), kv = keys of the block (BLOCK_N),
// d = head dim (HEAD_DIM).
#pragma once

#include <sycl/sycl.hpp>

#include <limits>

#include "block_schedule.hpp"
#include "mask.hpp"
#include "online_softmax.hpp"
#include "params.hpp"
#include "score_mod.hpp"
#include "seq_info.hpp"
#include "tile_io.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

template <typename T, int HEAD_DIM, int ROWS, int BLOCK_N, int FEATURES>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void flash_decode_kernel(DecodeParams p) {
  static_assert(ROWS <= BLOCK_N, "one work-item per row runs the softmax");
  static syclexp::work_group_static<float[ROWS][HEAD_DIM]> q_slm;    // (r, d) * q_prescale
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_N]> k_slm;  // (d, kv)
  static syclexp::work_group_static<float[BLOCK_N][HEAD_DIM]> v_slm;  // (kv, d)
  static syclexp::work_group_static<float[ROWS][BLOCK_N]> p_slm;      // (r, kv) scores, then P
  static syclexp::work_group_static<float[ROWS][HEAD_DIM]> acc_slm;   // (r, d) unnormalised O
  static syclexp::work_group_static<float[ROWS]> rescale_slm;         // (r) this block's rescale
  float(&q_tile)[ROWS][HEAD_DIM] = q_slm;
  float(&k_t)[HEAD_DIM][BLOCK_N] = k_slm;
  float(&v_tile)[BLOCK_N][HEAD_DIM] = v_slm;
  float(&probs)[ROWS][BLOCK_N] = p_slm;
  float(&acc)[ROWS][HEAD_DIM] = acc_slm;
  float(&rescale)[ROWS] = rescale_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto group = item.get_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const int heads_kv = c.dims.heads_q / c.dims.heads_per_kv;
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), c.num_blocks,
                                       heads_kv, /*reverse_blocks=*/false);
  const int b = coord.batch, h_kv = coord.head, split = coord.block;
  const SeqInfo seq = seq_info(c, b);
  const int len_q = seq.len_q;
  const int rows = c.dims.heads_per_kv * len_q;  // row r: head h_kv * group + r / Nq, token r % Nq
  const BlockMask mask = BlockMask::of(c.mask, seq);

  // This split's keys, cut to what any of the rows can see.
  const int64_t split_begin = static_cast<int64_t>(split) * p.split_keys;
  const int64_t kv_first = std::max<int64_t>(split_begin, mask.first_key(0) / BLOCK_N * BLOCK_N);
  const int64_t kv_end = std::min<int64_t>(split_begin + p.split_keys, mask.end_key(len_q));

  const int32_t* pages =
      c.seq.block_table != nullptr ? c.seq.block_table + b * c.seq.block_table_stride : nullptr;
  const int64_t k_batch = pages != nullptr ? 0 : b * p.k_stride.batch;
  const int64_t v_batch = pages != nullptr ? 0 : b * p.v_stride.batch;
  const KvRows<T> k{static_cast<const T*>(p.k) + k_batch + h_kv * p.k_stride.head,
                    p.k_stride.row, pages, p.k_stride.batch, c.seq.page_size};
  const KvRows<T> v{static_cast<const T*>(p.v) + v_batch + h_kv * p.v_stride.head,
                    p.v_stride.row, pages, p.v_stride.batch, c.seq.page_size};

  for (int i = lid; i < ROWS * HEAD_DIM; i += BLOCK_N) {
    const int r = i / HEAD_DIM, d = i % HEAD_DIM;
    float value = 0.f;
    if (r < rows && d < c.dims.head_dim) {
      const int h = h_kv * c.dims.heads_per_kv + r / len_q;
      const T* q = static_cast<const T*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head +
                   (seq.q_row0 + r % len_q) * p.q_stride.row;
      value = c.q_prescale * to_float(q[d]);
    }
    q_tile[r][d] = value;
    acc[r][d] = 0.f;
  }
  ScoreMod row_mod[ROWS];  // per row: rows of one work-group belong to different heads
  if constexpr (FEATURES != 0) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
      row_mod[r] = ScoreMod::of(c, seq, b, h_kv * c.dims.heads_per_kv + (r < rows ? r / len_q : 0));
  }
  OnlineSoftmaxRow softmax;  // of row lid, kept by work-items lid < ROWS

  for (int64_t kv_begin = kv_first; kv_begin < kv_end; kv_begin += BLOCK_N) {
    const int kv_rows = static_cast<int>(std::min<int64_t>(BLOCK_N, seq.len_k - kv_begin));
    sycl::group_barrier(group);
    load_tile_transposed<BLOCK_N, HEAD_DIM>(k_t, k, kv_begin, kv_rows, c.dims.head_dim, 1.f, lid,
                                            BLOCK_N);
    load_tile<BLOCK_N, HEAD_DIM>(v_tile, v, kv_begin, kv_rows, c.dims.head_dim, lid, BLOCK_N);
    sycl::group_barrier(group);

    // Scores: work-item = key.
    const int64_t key = kv_begin + lid;
    float score[ROWS];  // (r)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) score[r] = 0.f;
    for (int d = 0; d < HEAD_DIM; ++d) {
      const float k_d = k_t[d][lid];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) score[r] += q_tile[r][d] * k_d;
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t token = r < rows ? r % len_q : 0;
      if constexpr (FEATURES != 0) {
        float one[1] = {score[r]}, unused[1];
        row_mod[r].template apply<FEATURES>(one, unused, [&](int) {
          return std::pair<int64_t, int64_t>(token, key);
        });
        score[r] = one[0];
      }
      const bool visible = r < rows && key < kv_end && mask.visible(token, key);
      probs[r][lid] = visible ? score[r] : NEG_INF;
    }
    sycl::group_barrier(group);

    // Online softmax: work-item = row.
    if (lid < ROWS) {
      float(&row_scores)[BLOCK_N] = probs[lid];
      rescale[lid] = softmax.update(row_scores);
    }
    sycl::group_barrier(group);

    // P.V: work-item = head-dim column; each V element read once for every row.
    for (int d = lid; d < HEAD_DIM; d += BLOCK_N) {
      float sum[ROWS];  // (r)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) sum[r] = acc[r][d] * rescale[r];
      for (int j = 0; j < BLOCK_N; ++j) {
        const float v_jd = v_tile[j][d];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) sum[r] += probs[r][j] * v_jd;
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r][d] = sum[r];
    }
  }

  sycl::group_barrier(group);
  if (lid < ROWS) {
    // Row statistics live with work-item `lid`; publish them for the writers below.
    rescale[lid] = softmax.inverse_sum();
    probs[lid][0] = softmax.log_sum_exp();
  }
  sycl::group_barrier(group);
  for (int i = lid; i < ROWS * HEAD_DIM; i += BLOCK_N) {
    const int r = i / HEAD_DIM, d = i % HEAD_DIM;
    if (r >= rows || d >= c.dims.head_dim) continue;
    const int64_t h = h_kv * c.dims.heads_per_kv + r / len_q;
    const int64_t row = ((static_cast<int64_t>(b) * c.dims.heads_q + h) * c.dims.len_q + r % len_q);
    p.partial_out[(row * c.num_blocks + split) * c.dims.head_dim + d] = acc[r][d] * rescale[r];
    if (d == 0) p.partial_lse[row * c.num_blocks + split] = probs[r][0];
  }
}

// Combines the splits of flash_decode_kernel: one work-item per (batch, head, query row).
template <typename T>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void flash_decode_merge_kernel(DecodeParams p) {
  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int64_t row = static_cast<int64_t>(item.get_global_id(0));  // (b, h, token)
  if (row >= static_cast<int64_t>(c.dims.batch) * c.dims.heads_q * c.dims.len_q) return;
  const int token = static_cast<int>(row % c.dims.len_q);
  const int64_t bh = row / c.dims.len_q;
  const int b = static_cast<int>(bh / c.dims.heads_q), h = static_cast<int>(bh % c.dims.heads_q);
  const SeqInfo seq = seq_info(c, b);
  const int splits = c.num_blocks;
  const float* lse_s = p.partial_lse + row * splits;
  float max_lse = NEG_INF;
  for (int s = 0; s < splits; ++s) max_lse = sycl::fmax(max_lse, lse_s[s]);
  const float safe_max = max_lse == NEG_INF ? 0.f : max_lse;  // all splits empty: weights 0
  float total = 0.f;
  for (int s = 0; s < splits; ++s) total += sycl::exp(lse_s[s] - safe_max);
  const float inv_total = total > 0.f ? 1.f / total : 0.f;
  T* out = static_cast<T*>(p.out) + b * p.out_stride.batch + h * p.out_stride.head +
           token * p.out_stride.row;
  for (int d = 0; d < c.dims.head_dim; ++d) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s)
      sum += sycl::exp(lse_s[s] - safe_max) * p.partial_out[(row * splits + s) * c.dims.head_dim + d];
    out[d] = from_float<T>(sum * inv_total);
  }
  p.lse[lse_index(c, seq, b, h, token)] = total > 0.f ? safe_max + sycl::log(total) : NEG_INF;
}

}  // namespace ipex_flash
