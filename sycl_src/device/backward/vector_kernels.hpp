// FlashAttention-2 backward on the vector units, two kernels after flash_bwd_preprocess_kernel
// (backward/preprocess_kernel.hpp; same dimension legend as forward/vector_kernel.hpp):
//   flash_bwd_dkdv_kernel        one work-group per (batch, K/V head, K block); work-item j
//                                owns key j and sums over every query head sharing its K/V
//                                head, so dK and dV are written once, without atomics
//   flash_bwd_dq_kernel          one work-group per (batch, query head, Q block); work-item i
//                                owns query row i
// Both main kernels recompute P = exp2(score - LSE) from the forward's log-sum-exp (kept in
// the exp2 domain), with each score made in the forward's order of operations: Q multiplied
// by q_prescale, then summed with K over d in order (forward/vector_kernel.hpp), then the
// modifiers; so a row's P is the forward's to the rounding of the LSE (exactly 1 for a row of
// one key).
// dS = P * (dP - delta) with dP = dO.V^T (through the dropout mask), times the softcap's
// derivative. Every gradient is a plain sum in a fixed order: results are bitwise
// reproducible.
#pragma once

#include <sycl/sycl.hpp>

#include "common/block_schedule.hpp"
#include "backward/score_grads.hpp"
#include "common/kernel_props.hpp"
#include "score/dropout.hpp"
#include "score/block_mask.hpp"
#include "common/params.hpp"
#include "backward/params.hpp"
#include "score/softcap_alibi.hpp"
#include "common/seq_info.hpp"
#include "vector/tile_io.hpp"
#include "vector/tile_math.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// Rows (or keys) per register chunk. Smaller than the forward's: two chunks (P and dP) are
// live at once.
constexpr int BWD_CHUNK = 8;

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
IPEX_FLASH_REGISTER_FILE
void flash_bwd_dq_kernel(BwdParams p) {
  static_assert(BLOCK_N % BWD_CHUNK == 0, "tile shape");
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_M]> q_slm;   // (d, q) * q_prescale
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_M]> do_slm;  // (d, q)
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_M]> dq_slm;  // (d, q) accumulator
  static syclexp::work_group_static<float[BLOCK_N][HEAD_DIM]> k_slm;   // (kv, d)
  static syclexp::work_group_static<float[BLOCK_N][HEAD_DIM]> v_slm;   // (kv, d)
  float(&q_t)[HEAD_DIM][BLOCK_M] = q_slm;
  float(&do_t)[HEAD_DIM][BLOCK_M] = do_slm;
  float(&dq_t)[HEAD_DIM][BLOCK_M] = dq_slm;
  float(&k_tile)[BLOCK_N][HEAD_DIM] = k_slm;
  float(&v_tile)[BLOCK_N][HEAD_DIM] = v_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto group = item.get_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const QueryBlock block = query_block(c, static_cast<int64_t>(item.get_group(0)), BLOCK_M);
  if (block.empty) return;
  const int b = block.batch, h = block.head, h_kv = block.head_kv;
  const SeqInfo& seq = block.seq;
  const int64_t q_begin = block.begin, q_end = block.end;
  const int q_rows = static_cast<int>(q_end - q_begin);
  const int64_t row = q_begin + lid;
  const int64_t batch_head = block.batch_head;

  const int64_t q_row0 = seq.q_row0 + q_begin;
  const T* q = static_cast<const T*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head +
               q_row0 * p.q_stride.row;
  const T* dout = static_cast<const T*>(p.dout) + b * p.dout_stride.batch +
                  h * p.dout_stride.head + q_row0 * p.dout_stride.row;
  const KvRows<T> k = kv_rows<T>(p.k, p.k_stride, c, seq, b, h_kv);
  const KvRows<T> v = kv_rows<T>(p.v, p.v_stride, c, seq, b, h_kv);

  load_tile_transposed<BLOCK_M, HEAD_DIM>(q_t, q, p.q_stride.row, q_rows, c.dims.head_dim,
                                          c.q_prescale, lid, BLOCK_M);
  load_tile_transposed<BLOCK_M, HEAD_DIM>(do_t, dout, p.dout_stride.row, q_rows,
                                          c.dims.head_dim_v, 1.f, lid, BLOCK_M);
  for (int d = 0; d < HEAD_DIM; ++d) dq_t[d][lid] = 0.f;
  const bool valid_row = row < seq.len_q;
  const int64_t stats = lse_index(c, seq, b, h, valid_row ? row : 0);
  const float lse_log2 = lse_log2_or_inf(p.lse, stats, valid_row);
  const float delta = valid_row ? p.delta[stats] : 0.f;

  const BlockMask mask = BlockMask::of(c.mask, seq);
  const ScoreMod score_mod = ScoreMod::of(c, seq, b, h);
  const int64_t kv_first = mask.first_key(q_begin) / BLOCK_N * BLOCK_N;
  const int64_t kv_end = mask.end_key(q_end);
  for (int64_t kv_begin = kv_first; kv_begin < kv_end; kv_begin += BLOCK_N) {
    if (score_mod.attn_mask.hides_block<FEATURES>(group, k_tile[0][0], q_begin, q_begin + q_rows,
                                                  kv_begin,
                                                  std::min<int64_t>(kv_begin + BLOCK_N, kv_end),
                                                  lid, BLOCK_M))
      continue;
    load_kv_block(group, k_tile, v_tile, k, v, kv_begin, seq.len_k, c.dims.head_dim,
                  c.dims.head_dim_v, lid, BLOCK_M);
    const bool fully_visible =
        mask.block_fully_visible(q_begin, q_end, kv_begin, kv_begin + BLOCK_N);

    for (int c0 = 0; c0 < BLOCK_N && kv_begin + c0 < kv_end; c0 += BWD_CHUNK) {
      float prob[BWD_CHUNK];  // (c) P of this row
      dot_rows(prob, q_t, lid, k_tile, c0);
      float softcap_grad[BWD_CHUNK];  // (c) d score / d raw score
      if constexpr (FEATURES != 0) {
        score_mod.apply<FEATURES>(prob, softcap_grad, row, kv_begin + c0, 0, 1);
      }
      if (!fully_visible) mask.apply_to_keys(prob, row, kv_begin + c0);
#pragma unroll
      for (int j = 0; j < BWD_CHUNK; ++j) prob[j] = sycl::exp2(prob[j] - lse_log2);
      float dscore[BWD_CHUNK];  // (c) dP, then dS
      dot_rows(dscore, do_t, lid, v_tile, c0);
      if (c.dropout.enabled) {  // dP of the undropped P: dO.V^T through the same mask
        float factor[BWD_CHUNK];
        dropout_factors_for_keys<FEATURES>(dropout_draw<FEATURES>(c, batch_head),
            row, kv_begin + c0, factor);
#pragma unroll
        for (int j = 0; j < BWD_CHUNK; ++j) dscore[j] *= factor[j];
      }
#pragma unroll
      for (int j = 0; j < BWD_CHUNK; ++j) dscore[j] = prob[j] * (dscore[j] - delta);
      if constexpr ((FEATURES & FEATURE_SOFTCAP) != 0) {
#pragma unroll
        for (int j = 0; j < BWD_CHUNK; ++j) dscore[j] *= softcap_grad[j];
      }
      accumulate_rows(dq_t, lid, dscore, k_tile, c0, 1.f);
    }
  }

  if (valid_row) {
    T* dq = static_cast<T*>(p.dq) + b * p.dq_stride.batch + h * p.dq_stride.head +
            (seq.q_row0 + row) * p.dq_stride.row;
    for (int d = 0; d < c.dims.head_dim; ++d) dq[d] = from_float<T>(dq_t[d][lid] * c.scale);
  }
}

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
IPEX_FLASH_REGISTER_FILE
void flash_bwd_dkdv_kernel(BwdParams p) {
  static_assert(BLOCK_M % BWD_CHUNK == 0, "tile shape");
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_N]> k_slm;   // (d, kv)
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_N]> v_slm;   // (d, kv)
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_N]> dk_slm;  // (d, kv) accumulator
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_N]> dv_slm;  // (d, kv) accumulator
  static syclexp::work_group_static<float[BLOCK_M][HEAD_DIM]> q_slm;   // (q, d) * q_prescale
  static syclexp::work_group_static<float[BLOCK_M][HEAD_DIM]> do_slm;  // (q, d)
  static syclexp::work_group_static<float[BLOCK_M]> lse_slm;           // (q) LSE, exp2 domain
  static syclexp::work_group_static<float[BLOCK_M]> delta_slm;         // (q)
  float(&k_t)[HEAD_DIM][BLOCK_N] = k_slm;
  float(&v_t)[HEAD_DIM][BLOCK_N] = v_slm;
  float(&dk_t)[HEAD_DIM][BLOCK_N] = dk_slm;
  float(&dv_t)[HEAD_DIM][BLOCK_N] = dv_slm;
  float(&q_tile)[BLOCK_M][HEAD_DIM] = q_slm;
  float(&do_tile)[BLOCK_M][HEAD_DIM] = do_slm;
  float(&lse_log2)[BLOCK_M] = lse_slm;
  float(&delta)[BLOCK_M] = delta_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto group = item.get_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const int heads_kv = c.dims.heads_kv();
  // Lowest K blocks first: under a causal mask they are seen by the most query rows.
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), c.num_blocks,
                                       heads_kv, /*reverse_blocks=*/false);
  const int b = coord.batch, h_kv = coord.head;
  const SeqInfo seq = seq_info(c, b);
  const int64_t kv_begin = static_cast<int64_t>(coord.block) * BLOCK_N;
  if (kv_begin >= seq.len_k) return;  // the whole work-group leaves together
  const int64_t kv_end = std::min<int64_t>(kv_begin + BLOCK_N, seq.len_k);
  const int64_t key = kv_begin + lid;

  const T* k = static_cast<const T*>(p.k) + b * p.k_stride.batch + h_kv * p.k_stride.head +
               (seq.k_row0 + kv_begin) * p.k_stride.row;
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride.batch + h_kv * p.v_stride.head +
               (seq.k_row0 + kv_begin) * p.v_stride.row;
  // Q, not K, carries q_prescale, as in the forward: the scores' products are then the
  // forward's, bit for bit. dK is a sum over that scaled Q; scale / q_prescale undoes it.
  load_tile_transposed<BLOCK_N, HEAD_DIM>(k_t, k, p.k_stride.row,
                                          static_cast<int>(kv_end - kv_begin), c.dims.head_dim,
                                          1.f, lid, BLOCK_N);
  load_tile_transposed<BLOCK_N, HEAD_DIM>(v_t, v, p.v_stride.row,
                                          static_cast<int>(kv_end - kv_begin), c.dims.head_dim_v,
                                          1.f, lid, BLOCK_N);
  for (int d = 0; d < HEAD_DIM; ++d) dk_t[d][lid] = dv_t[d][lid] = 0.f;

  const BlockMask mask = BlockMask::of(c.mask, seq);
  const int64_t q_first = mask.first_row(kv_begin) / BLOCK_M * BLOCK_M;
  const int64_t q_last = mask.end_row(kv_end, seq.len_q);  // rows past it see no key here

  for (int h = h_kv * c.dims.heads_per_kv; h < (h_kv + 1) * c.dims.heads_per_kv; ++h) {
    const int64_t batch_head = static_cast<int64_t>(b) * c.dims.heads_q + h;
    const ScoreMod score_mod = ScoreMod::of(c, seq, b, h);
    const T* q = static_cast<const T*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head +
                 seq.q_row0 * p.q_stride.row;
    const T* dout = static_cast<const T*>(p.dout) + b * p.dout_stride.batch +
                    h * p.dout_stride.head + seq.q_row0 * p.dout_stride.row;
    for (int64_t q_begin = q_first; q_begin < q_last; q_begin += BLOCK_M) {
      const int64_t q_end = std::min<int64_t>(q_begin + BLOCK_M, seq.len_q);
      const int q_rows = static_cast<int>(q_end - q_begin);
      if (score_mod.attn_mask.hides_block<FEATURES>(group, q_tile[0][0], q_begin, q_end,
                                                    kv_begin, kv_end, lid, BLOCK_N))
        continue;
      sycl::group_barrier(group);
      load_tile<BLOCK_M, HEAD_DIM>(q_tile, q + q_begin * p.q_stride.row, p.q_stride.row, q_rows,
                                   c.dims.head_dim, lid, BLOCK_N, c.q_prescale);
      load_tile<BLOCK_M, HEAD_DIM>(do_tile, dout + q_begin * p.dout_stride.row,
                                   p.dout_stride.row, q_rows, c.dims.head_dim_v, lid, BLOCK_N);
      for (int i = lid; i < BLOCK_M; i += BLOCK_N) {
        const bool valid = q_begin + i < seq.len_q;
        const int64_t stats = lse_index(c, seq, b, h, valid ? q_begin + i : 0);
        lse_log2[i] = lse_log2_or_inf(p.lse, stats, valid);
        delta[i] = valid ? p.delta[stats] : 0.f;
      }
      sycl::group_barrier(group);
      const bool fully_visible =
          mask.block_fully_visible(q_begin, q_end, kv_begin, kv_begin + BLOCK_N);

      for (int r0 = 0; r0 < BLOCK_M && q_begin + r0 < q_last; r0 += BWD_CHUNK) {
        float prob[BWD_CHUNK];  // (r) P of this key
        dot_rows(prob, k_t, lid, q_tile, r0);
        float softcap_grad[BWD_CHUNK];  // (r) d score / d raw score
        if constexpr (FEATURES != 0) {
          score_mod.apply<FEATURES>(prob, softcap_grad, q_begin + r0, key, 1, 0);
        }
        if (!fully_visible) mask.apply_to_rows(prob, q_begin + r0, key);
#pragma unroll
        for (int i = 0; i < BWD_CHUNK; ++i) prob[i] = sycl::exp2(prob[i] - lse_log2[r0 + i]);
        float factor[BWD_CHUNK];  // (r) dropout: 1/(1-p) kept, 0 dropped
#pragma unroll
        for (int i = 0; i < BWD_CHUNK; ++i) factor[i] = 1.f;
        if (c.dropout.enabled)
          dropout_factors_for_rows(dropout_draw<FEATURES>(c, batch_head),
              q_begin + r0, key, factor);
        float dropped[BWD_CHUNK];  // (r) the forward's P after dropout
#pragma unroll
        for (int i = 0; i < BWD_CHUNK; ++i) dropped[i] = prob[i] * factor[i];
        accumulate_rows(dv_t, lid, dropped, do_tile, r0, 1.f);  // dV += P_dropped^T dO
        float dscore[BWD_CHUNK];  // (r) dP, then dS
        dot_rows(dscore, v_t, lid, do_tile, r0);
#pragma unroll
        for (int i = 0; i < BWD_CHUNK; ++i)
          dscore[i] = prob[i] * (dscore[i] * factor[i] - delta[r0 + i]);
        if constexpr ((FEATURES & FEATURE_SOFTCAP) != 0) {
#pragma unroll
          for (int i = 0; i < BWD_CHUNK; ++i) dscore[i] *= softcap_grad[i];
        }
        accumulate_rows(dk_t, lid, dscore, q_tile, r0, 1.f);  // dK += dS^T Q
      }
    }
  }

  if (key < seq.len_k) {
    T* dk = static_cast<T*>(p.dk) + b * p.dk_stride.batch + h_kv * p.dk_stride.head +
            (seq.k_row0 + key) * p.dk_stride.row;
    T* dv = static_cast<T*>(p.dv) + b * p.dv_stride.batch + h_kv * p.dv_stride.head +
            (seq.k_row0 + key) * p.dv_stride.row;
    const float dk_scale = c.q_prescale != 0.f ? c.scale / c.q_prescale : 0.f;  // scale 0: dK 0
    for (int d = 0; d < c.dims.head_dim; ++d) dk[d] = from_float<T>(dk_t[d][lid] * dk_scale);
    for (int d = 0; d < c.dims.head_dim_v; ++d) dv[d] = from_float<T>(dv_t[d][lid]);
  }
}

}  // namespace ipex_flash
