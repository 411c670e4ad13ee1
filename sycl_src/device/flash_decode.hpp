// Decoding: attention of a few new query rows per sequence against a (possibly paged) KV
// cache. Memory-bound, so it is organised around reading each K/V element once:
//   one work-group per (batch, K/V head, split of the keys) serves all query rows of the GQA
//   group (heads_per_kv heads x Nq new tokens, at most DECODE_ROWS), so each K/V element is
//   read once for every head that shares it; the keys are split across work-groups so that a
//   few long sequences still fill the device;
//   K/V blocks are copied into SLM with contiguous vector loads; for the scores and the
//   softmax work-item r owns query row r (K elements broadcast), for P.V work-item i owns
//   head-dim columns i, i + 16, ... (P elements broadcast, V rows read as vectors), so the
//   product keeps every lane busy even when the group has only a few rows;
//   each split writes its normalised partial output and LSE; flash_decode_merge_kernel
//   combines them: out = sum_s exp(lse_s - lse) * out_s, lse = log sum_s exp(lse_s).
// Dimension legend: r = query rows of the group, kv = keys of the block (BLOCK_N), c = keys of
// a register chunk, d = head dim (HEAD_DIM).
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
#include "tile_math.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

constexpr int DECODE_KEY_CHUNK = 16;  // keys per register chunk of scores

// GROUP_ROWS: the group's query rows rounded up to a power of two (<= DECODE_LANES); it sizes
// the per-lane accumulators of the P.V phase.
template <typename T, int HEAD_DIM, int GROUP_ROWS, int BLOCK_N, int FEATURES>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<DECODE_LANES>))
void flash_decode_kernel(DecodeParams p) {
  static_assert(BLOCK_N % DECODE_KEY_CHUNK == 0 && HEAD_DIM % DECODE_LANES == 0, "tile shape");
  static_assert(GROUP_ROWS <= DECODE_LANES, "one lane per query row");
  static syclexp::work_group_static<float[HEAD_DIM][DECODE_LANES]> q_slm;   // (d, r) * prescale
  static syclexp::work_group_static<float[BLOCK_N][HEAD_DIM]> k_slm;        // (kv, d)
  static syclexp::work_group_static<float[BLOCK_N][HEAD_DIM]> v_slm;        // (kv, d)
  static syclexp::work_group_static<float[DECODE_KEY_CHUNK][DECODE_LANES]> p_slm;  // (c, r)
  static syclexp::work_group_static<float[DECODE_LANES]> rescale_slm;       // (r)
  static syclexp::work_group_static<float[GROUP_ROWS][HEAD_DIM]> acc_slm;   // (r, d) O
  float(&q_t)[HEAD_DIM][DECODE_LANES] = q_slm;
  float(&k_tile)[BLOCK_N][HEAD_DIM] = k_slm;
  float(&v_tile)[BLOCK_N][HEAD_DIM] = v_slm;
  float(&probs)[DECODE_KEY_CHUNK][DECODE_LANES] = p_slm;
  float(&rescale)[DECODE_LANES] = rescale_slm;
  float(&acc)[GROUP_ROWS][HEAD_DIM] = acc_slm;

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
  const int rows = c.dims.heads_per_kv * len_q;
  // Row r of the group: query head h_kv * heads_per_kv + r / Nq, new token r % Nq.
  const bool valid_row = lid < rows;
  const int h = h_kv * c.dims.heads_per_kv + (valid_row ? lid / len_q : 0);
  const int64_t token = valid_row ? lid % len_q : 0;
  const BlockMask mask = BlockMask::of(c.mask, seq);

  // This split's keys, cut to what any of the rows can see.
  const int64_t split_begin = static_cast<int64_t>(split) * p.split_keys;
  const int64_t kv_first = std::max<int64_t>(split_begin, mask.first_key(0) / BLOCK_N * BLOCK_N);
  const int64_t kv_end = std::min<int64_t>(split_begin + p.split_keys, mask.end_key(len_q));
  const KvRows<T> k = kv_rows<T>(p.k, p.k_stride, c, seq, b, h_kv);
  const KvRows<T> v = kv_rows<T>(p.v, p.v_stride, c, seq, b, h_kv);

  const T* q = static_cast<const T*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head +
               (seq.q_row0 + token) * p.q_stride.row;
  for (int d = 0; d < HEAD_DIM; ++d)  // own column: lanes are rows here
    q_t[d][lid] = valid_row && d < c.dims.head_dim ? c.q_prescale * to_float(q[d]) : 0.f;
  for (int r = 0; r < GROUP_ROWS; ++r)  // lanes are head-dim columns here
    for (int d = lid; d < HEAD_DIM; d += DECODE_LANES) acc[r][d] = 0.f;
  const ScoreMod score_mod = ScoreMod::of(c, seq, b, h);  // per row: rows span heads
  OnlineSoftmaxRow softmax;

  for (int64_t kv_begin = kv_first; kv_begin < kv_end; kv_begin += BLOCK_N) {
    load_kv_block_sub_group<BLOCK_N, HEAD_DIM, DECODE_LANES>(group, item.get_sub_group(), k_tile,
                                                             v_tile, k, v, kv_begin, seq.len_k,
                                                             c.dims.head_dim, lid);
    for (int c0 = 0; c0 < BLOCK_N && kv_begin + c0 < kv_end; c0 += DECODE_KEY_CHUNK) {
      // Scores and softmax: lane = query row (K elements broadcast to all rows).
      float scores[DECODE_KEY_CHUNK];  // (c)
      dot_rows(scores, q_t, lid, k_tile, c0);
      if constexpr (FEATURES != 0) {
        float unused_grad[DECODE_KEY_CHUNK];
        score_mod.apply<FEATURES>(scores, unused_grad, [&](int j) {
          return std::pair<int64_t, int64_t>(token, kv_begin + c0 + j);
        });
      }
#pragma unroll
      for (int j = 0; j < DECODE_KEY_CHUNK; ++j) {  // the mask, the split's end, padding rows
        const int64_t key = kv_begin + c0 + j;
        if (!valid_row || key >= kv_end || !mask.visible(token, key)) scores[j] = NEG_INF;
      }
      rescale[lid] = softmax.update(scores);
#pragma unroll
      for (int j = 0; j < DECODE_KEY_CHUNK; ++j) probs[j][lid] = scores[j];
      sycl::group_barrier(group);

      // P.V: lane = head-dim column, so every lane is busy however few rows the group has;
      // P elements are broadcast, V rows read as vectors.
      for (int d = lid; d < HEAD_DIM; d += DECODE_LANES) {
        float sum[GROUP_ROWS];  // (r)
#pragma unroll
        for (int r = 0; r < GROUP_ROWS; ++r) sum[r] = acc[r][d] * rescale[r];
        for (int j = 0; j < DECODE_KEY_CHUNK; ++j) {
          const float v_jd = v_tile[c0 + j][d];
#pragma unroll
          for (int r = 0; r < GROUP_ROWS; ++r) sum[r] += probs[j][r] * v_jd;
        }
#pragma unroll
        for (int r = 0; r < GROUP_ROWS; ++r) acc[r][d] = sum[r];
      }
      sycl::group_barrier(group);  // before the next chunk overwrites probs
    }
  }

  // Row statistics live in lane r; the output is written with lanes along d.
  rescale[lid] = softmax.inverse_sum();
  if (valid_row) {
    const int64_t row = (static_cast<int64_t>(b) * c.dims.heads_q + h) * c.dims.len_q + token;
    p.partial_lse[row * c.num_blocks + split] = softmax.log_sum_exp();
  }
  sycl::group_barrier(group);
  for (int r = 0; r < GROUP_ROWS && r < rows; ++r) {
    const int64_t head = h_kv * c.dims.heads_per_kv + r / len_q;
    const int64_t row = (static_cast<int64_t>(b) * c.dims.heads_q + head) * c.dims.len_q + r % len_q;
    float* partial = p.partial_out + (row * c.num_blocks + split) * c.dims.head_dim;
    for (int d = lid; d < c.dims.head_dim; d += DECODE_LANES) partial[d] = acc[r][d] * rescale[r];
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
