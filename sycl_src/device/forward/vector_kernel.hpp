// FlashAttention-2 forward. Dimension legend used in the tile comments:
//   q  : query rows of this work-group's block (BLOCK_M)
//   kv : keys of the K/V block currently in SLM (BLOCK_N)
//   c  : keys of one register chunk (FWD_KEY_CHUNK)
//   d  : head dim, padded to the compiled HEAD_DIM (padding columns are zero): Q and K have
//        dims.head_dim columns
//   dv : V's and O's, dims.head_dim_v padded to HEAD_DIM_V: the host compiles it apart where
//        the two pad differently (MLA prefill: 192 and 128), so that V's tile, the output
//        accumulator and P.V are not padded to the larger one
//
// One work-group per (batch, query head, Q block); work-item i owns query row i of the block
// and keeps a FWD_KEY_CHUNK-wide register tile of its scores. Consecutive work-items are SIMD
// lanes (on the CPU device the compiler vectorises across them, on a GPU they are the
// sub-group's lanes), so every SLM read is either one row of lanes (transposed tiles) or a
// broadcast of one value to all lanes (K and V elements, the same for every query row).
#pragma once

#include <sycl/sycl.hpp>

#include "common/block_schedule.hpp"
#include "common/kernel_props.hpp"
#include "score/dropout.hpp"
#include "forward/block_edges.hpp"
#include "common/kv_quant.hpp"
#include "score/block_mask.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "forward/params.hpp"
#include "score/softcap_alibi.hpp"
#include "common/seq_info.hpp"
#include "vector/tile_io.hpp"
#include "vector/tile_math.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

constexpr int FWD_KEY_CHUNK = 16;  // scores per work-item held in registers at once

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int HEAD_DIM_V>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
IPEX_FLASH_REGISTER_FILE
void flash_fwd_kernel(FwdParams p) {
  constexpr int KEY_CHUNK = FWD_KEY_CHUNK;
  static_assert(BLOCK_N % KEY_CHUNK == 0 && HEAD_DIM % D_UNROLL == 0 &&
                    HEAD_DIM_V % D_UNROLL == 0,
                "tile shape");
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_M]> q_slm;      // (d, q) * q_prescale
  static syclexp::work_group_static<float[HEAD_DIM_V][BLOCK_M]> acc_slm;  // (dv, q) unnormalised O
  static syclexp::work_group_static<float[BLOCK_N][HEAD_DIM]> k_slm;      // (kv, d)
  static syclexp::work_group_static<float[BLOCK_N][HEAD_DIM_V]> v_slm;    // (kv, dv)
  float(&q_t)[HEAD_DIM][BLOCK_M] = q_slm;
  float(&acc_t)[HEAD_DIM_V][BLOCK_M] = acc_slm;
  float(&k_tile)[BLOCK_N][HEAD_DIM] = k_slm;
  float(&v_tile)[BLOCK_N][HEAD_DIM_V] = v_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto group = item.get_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const QueryBlock block = query_block(c, static_cast<int64_t>(item.get_group(0)), BLOCK_M);
  if (block.empty) return;
  const SeqInfo& seq = block.seq;
  const int64_t q_begin = block.begin, q_end = block.end;
  const int64_t row = q_begin + lid;
  const int64_t batch_head = block.batch_head;
  using KV = kv_storage_t<T, FEATURES>;  // the K/V elements: T, or FP8 (common/kv_quant.hpp)
  const ForwardOperands<T, KV> operands = forward_operands<T, KV>(p, block);
  const T* q = operands.q;
  const KvRows<KV>& k = operands.k;
  const KvRows<KV>& v = operands.v;

  // K's descale is folded into Q's scale (common/kv_quant.hpp).
  load_tile_transposed<BLOCK_M, HEAD_DIM>(
      q_t, q, p.q_stride.row, static_cast<int>(q_end - q_begin), c.dims.head_dim,
      c.q_prescale * kv_descale<FEATURES>(c, block.batch, block.head_kv).k, lid, BLOCK_M);
  for (int d = 0; d < HEAD_DIM_V; ++d) acc_t[d][lid] = 0.f;  // own column only: no barrier

  const BlockMask mask = BlockMask::of(c.mask, seq);
  const ScoreMod score_mod = ScoreMod::of(c, seq, block.batch, block.head);
  const int64_t kv_first = mask.first_key(q_begin) / BLOCK_N * BLOCK_N;
  const int64_t kv_end = mask.end_key(q_end);  // blocks past it are never visited
  OnlineSoftmaxRow softmax = ScoreMod::start_row(c, block.head);

  for (int64_t kv_begin = kv_first; kv_begin < kv_end; kv_begin += BLOCK_N) {
    if constexpr ((FEATURES & FEATURE_ATTN_MASK) != 0) {  // blocks the user's mask hides
      if (!score_mod.attn_mask.any_visible<FEATURES>(
              group, k_tile[0][0], q_begin, static_cast<int>(q_end - q_begin), kv_begin,
              static_cast<int>(std::min<int64_t>(BLOCK_N, kv_end - kv_begin)), lid, BLOCK_M))
        continue;
    }
    load_kv_block(group, k_tile, v_tile, k, v, kv_begin, seq.len_k, c.dims.head_dim,
                  c.dims.head_dim_v, lid, BLOCK_M);
    // Only blocks that straddle a mask boundary (or the end of the keys) test elements.
    const bool fully_visible =
        mask.block_fully_visible(q_begin, q_end, kv_begin, kv_begin + BLOCK_N);

    for (int c0 = 0; c0 < BLOCK_N && kv_begin + c0 < kv_end; c0 += KEY_CHUNK) {
      float scores[KEY_CHUNK];  // (c) for this work-item's row
      dot_rows(scores, q_t, lid, k_tile, c0);
      if constexpr (FEATURES != 0) {
        float unused_grad[KEY_CHUNK];
        score_mod.apply<FEATURES>(scores, unused_grad, row, kv_begin + c0, 0, 1);
      }
      if (!fully_visible) mask.apply_to_keys(scores, row, kv_begin + c0);
      const float rescale = softmax.update(scores);  // scores now hold probabilities
      if (c.dropout.enabled) {  // after the row sum: dropout rescales P, not the softmax
        float factor[KEY_CHUNK];
        dropout_factors_for_keys<FEATURES>(dropout_draw<FEATURES>(c, batch_head),
            row, kv_begin + c0, factor);
#pragma unroll
        for (int j = 0; j < KEY_CHUNK; ++j) scores[j] *= factor[j];
      }
      accumulate_rows(acc_t, lid, scores, v_tile, c0, rescale);
    }
  }

  write_output_row<T>(p, block, lid, acc_t, softmax,
                      kv_descale<FEATURES>(c, block.batch, block.head_kv).v);
}

// The same forward for head dims whose whole K and V rows do not fit the device's local memory
// beside Q and the accumulator (the host's choice, forward_variant.cpp: past 256 on GPUs with
// 64 KiB, MLA's 576 / 512 with 128 KiB): K and V go through SLM KV_COLS columns at a time.
// A K/V block is one register chunk of keys (BLOCK_N = FWD_KEY_CHUNK), whose scores are summed
// slab by slab of K, in the order of the kernel above, then P.V updates the accumulator slab
// by slab of V; each slab between two barriers.
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int HEAD_DIM_V,
          int KV_COLS>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
IPEX_FLASH_REGISTER_FILE
void flash_fwd_slab_kernel(FwdParams p) {
  constexpr int KEY_CHUNK = FWD_KEY_CHUNK;
  static_assert(BLOCK_N == KEY_CHUNK && HEAD_DIM % KV_COLS == 0 && HEAD_DIM_V % KV_COLS == 0 &&
                    KV_COLS % D_UNROLL == 0,
                "tile shape");
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_M]> q_slm;      // (d, q) * q_prescale
  static syclexp::work_group_static<float[HEAD_DIM_V][BLOCK_M]> acc_slm;  // (dv, q) unnormalised O
  static syclexp::work_group_static<float[BLOCK_N][KV_COLS]> k_slm;       // (kv, a slab of d)
  static syclexp::work_group_static<float[BLOCK_N][KV_COLS]> v_slm;       // (kv, a slab of dv)
  float(&q_t)[HEAD_DIM][BLOCK_M] = q_slm;
  float(&acc_t)[HEAD_DIM_V][BLOCK_M] = acc_slm;
  float(&k_tile)[BLOCK_N][KV_COLS] = k_slm;
  float(&v_tile)[BLOCK_N][KV_COLS] = v_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto group = item.get_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const QueryBlock block = query_block(c, static_cast<int64_t>(item.get_group(0)), BLOCK_M);
  if (block.empty) return;
  const SeqInfo& seq = block.seq;
  const int64_t q_begin = block.begin, q_end = block.end;
  const int64_t row = q_begin + lid;
  const int64_t batch_head = block.batch_head;
  using KV = kv_storage_t<T, FEATURES>;
  const ForwardOperands<T, KV> operands = forward_operands<T, KV>(p, block);

  load_tile_transposed<BLOCK_M, HEAD_DIM>(
      q_t, operands.q, p.q_stride.row, static_cast<int>(q_end - q_begin), c.dims.head_dim,
      c.q_prescale * kv_descale<FEATURES>(c, block.batch, block.head_kv).k, lid, BLOCK_M);
  for (int d = 0; d < HEAD_DIM_V; ++d) acc_t[d][lid] = 0.f;

  const BlockMask mask = BlockMask::of(c.mask, seq);
  const ScoreMod score_mod = ScoreMod::of(c, seq, block.batch, block.head);
  const int64_t kv_first = mask.first_key(q_begin) / BLOCK_N * BLOCK_N;
  const int64_t kv_end = mask.end_key(q_end);
  OnlineSoftmaxRow softmax = ScoreMod::start_row(c, block.head);

  for (int64_t kv_begin = kv_first; kv_begin < kv_end; kv_begin += BLOCK_N) {
    if constexpr ((FEATURES & FEATURE_ATTN_MASK) != 0) {
      if (!score_mod.attn_mask.any_visible<FEATURES>(
              group, k_tile[0][0], q_begin, static_cast<int>(q_end - q_begin), kv_begin,
              static_cast<int>(std::min<int64_t>(BLOCK_N, kv_end - kv_begin)), lid, BLOCK_M))
        continue;
    }
    const int rows = static_cast<int>(std::min<int64_t>(BLOCK_N, seq.len_k - kv_begin));
    const bool fully_visible =
        mask.block_fully_visible(q_begin, q_end, kv_begin, kv_begin + BLOCK_N);

    float scores[KEY_CHUNK] = {};  // (kv) for this work-item's row
    for (int s0 = 0; s0 < HEAD_DIM; s0 += KV_COLS) {
      KvRows<KV> slab = operands.k;
      slab.base += s0;  // columns s0 .. s0 + KV_COLS of each row (past head_dim: zeros)
      sycl::group_barrier(group);
      load_tile<BLOCK_N, KV_COLS>(k_tile, slab, kv_begin, rows, c.dims.head_dim - s0, lid,
                                  BLOCK_M);
      sycl::group_barrier(group);
      dot_rows_slab(scores, q_t, lid, k_tile, 0, s0);
    }
    if constexpr (FEATURES != 0) {
      float unused_grad[KEY_CHUNK];
      score_mod.apply<FEATURES>(scores, unused_grad, row, kv_begin, 0, 1);
    }
    if (!fully_visible) mask.apply_to_keys(scores, row, kv_begin);
    const float rescale = softmax.update(scores);  // scores now hold probabilities
    if (c.dropout.enabled) {
      float factor[KEY_CHUNK];
      dropout_factors_for_keys<FEATURES>(dropout_draw<FEATURES>(c, batch_head),
          row, kv_begin, factor);
#pragma unroll
      for (int j = 0; j < KEY_CHUNK; ++j) scores[j] *= factor[j];
    }
    for (int s0 = 0; s0 < HEAD_DIM_V; s0 += KV_COLS) {
      KvRows<KV> slab = operands.v;
      slab.base += s0;
      sycl::group_barrier(group);
      load_tile<BLOCK_N, KV_COLS>(v_tile, slab, kv_begin, rows, c.dims.head_dim_v - s0, lid,
                                  BLOCK_M);
      sycl::group_barrier(group);
      accumulate_rows_slab(acc_t, lid, scores, v_tile, 0, s0, rescale);
    }
  }

  write_output_row<T>(p, block, lid, acc_t, softmax,
                      kv_descale<FEATURES>(c, block.batch, block.head_kv).v);
}

}  // namespace ipex_flash
