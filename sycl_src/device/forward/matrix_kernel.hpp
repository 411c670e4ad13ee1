// FlashAttention-2 forward with the two products on the matrix engine (XMX on Intel GPUs, AMX
// on Xeons): the same blocks, mask, score modifiers, dropout and online softmax as
// forward/vector_kernel.hpp, for 16-bit queries over 16-bit or FP8 K/V. Dimension legend as
// there (q, kv, d), plus
//   r : the MATRIX_N query rows of one sub-group (16; 8 on DG2 / Arrow Lake-H's XMX)
//
// One work-group per (batch, query head, Q block), BLOCK_M / MATRIX_N sub-groups of MATRIX_N
// lanes; each sub-group owns MATRIX_N query rows (the accumulators' columns) and work-item r of
// it owns row r for the softmax. Per K/V block:
//   S^T (kv, r) = K (kv, d) . Q^T (d, r)        matrix engine, fp32 accumulators, to SLM
//   softmax over kv, one row per work-item     vector units
//   O^T (d, r) += V^T (d, kv) . P^T (kv, r)    matrix engine
// Everything is computed transposed, with the query row as the fastest index, so that the
// softmax work-items (one per row) read and write consecutive addresses: the scores S^T, the
// probabilities P^T (packed two keys to a word, the layout the matrix engine takes for B) and
// the accumulator O^T, which the online softmax rescales. Q^T is packed once.
//
// This SLM-staged form serves AMX, whose eight tile registers cannot hold a block's
// accumulators and whose layout of a tile over a sub-group's work-items is not known to be the
// lane-column layout forward/registers_kernel.hpp needs, and the GPUs with 128 registers per
// thread (DG2, Arrow Lake-H), too few for them; the GPUs with 256 run that one
// (matrix_tiles_in_registers, matrix_path.cpp).
// K and V^T come from the packed copy (forward/pack_kv.hpp). With nothing of K or V in SLM, the
// sub-groups never wait on each other: there is no work-group barrier.
// P is rounded to the input dtype before its product, as in FlashAttention-2 on GPUs.
// FP8 caches' descales are folded into the score scale and the final normalisation as in the
// vector kernel.
#pragma once

#include <sycl/sycl.hpp>

#include "common/block_schedule.hpp"
#include "common/kernel_props.hpp"
#include "score/dropout.hpp"
#include "forward/block_edges.hpp"
#include "forward/pack_kv.hpp"
#include "common/kv_quant.hpp"
#include "score/block_mask.hpp"
#include "matrix/slm_tile.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "forward/params.hpp"
#include "score/softcap_alibi.hpp"
#include "common/seq_info.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<MATRIX_N>))
IPEX_FLASH_REGISTER_FILE
void flash_fwd_matrix_kernel(FwdParams p) {
  constexpr int R = MATRIX_N;  // accumulator columns are the sub-group's rows
  static_assert(BLOCK_M % R == 0 && BLOCK_N % MATRIX_M == 0 && BLOCK_N % MATRIX_K == 0 &&
                    BLOCK_N % MATRIX_KEY_CHUNK == 0 && HEAD_DIM % MATRIX_K == 0 &&
                    HEAD_DIM % MATRIX_M == 0,
                "tile shape");
  static syclexp::work_group_static<uint32_t[HEAD_DIM / 2][BLOCK_M]> q_slm;  // (d/2, q) packed
  static syclexp::work_group_static<float[BLOCK_N][BLOCK_M]> s_slm;          // (kv, q) scores
  static syclexp::work_group_static<uint32_t[BLOCK_N / 2][BLOCK_M]> p_slm;   // (kv/2, q) packed
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_M]> acc_slm;       // (d, q) unnormalised O
  uint32_t(&q_t)[HEAD_DIM / 2][BLOCK_M] = q_slm;
  float(&s_t)[BLOCK_N][BLOCK_M] = s_slm;
  uint32_t(&p_t)[BLOCK_N / 2][BLOCK_M] = p_slm;
  float(&acc_t)[HEAD_DIM][BLOCK_M] = acc_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto sg = item.get_sub_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const int r0 = lid - static_cast<int>(sg.get_local_id()[0]);  // sub-group's first row
  const QueryBlock block = query_block(c, static_cast<int64_t>(item.get_group(0)), BLOCK_M);
  if (block.empty) return;
  const SeqInfo& seq = block.seq;
  const int64_t q_begin = block.begin, q_end = block.end;
  const int64_t row = q_begin + lid;
  const T* q = forward_operands<T>(p, block).q;
  const KvDescale descale = kv_descale<FEATURES>(c, block.batch, block.head_kv);
  const float score_scale = c.q_prescale * descale.k;
  using Packed = PackedKv<T, HEAD_DIM, BLOCK_N>;
  constexpr auto GLOBAL = sycl::access::address_space::global_space;
  constexpr int S_STRIPS = matrix_strips(BLOCK_N / MATRIX_M);
  constexpr int O_STRIPS = matrix_strips(HEAD_DIM / MATRIX_M);

  // Q stays in its dtype (the matrix engine reads it as is); the softmax scale is applied to
  // the fp32 scores instead.
  load_tile_packed<BLOCK_M, HEAD_DIM>(q_t, q, p.q_stride.row,
                                      static_cast<int>(q_end - q_begin), c.dims.head_dim, lid,
                                      BLOCK_M);
  for (int d = 0; d < HEAD_DIM; ++d) acc_t[d][lid] = 0.f;

  const BlockMask mask = BlockMask::of(c.mask, seq);
  const ScoreMod score_mod = ScoreMod::of(c, seq, block.batch, block.head);
  const int64_t kv_first = mask.first_key(q_begin) / BLOCK_N * BLOCK_N;
  const int64_t kv_end = mask.end_key(q_end);
  OnlineSoftmaxRow softmax = ScoreMod::start_row(c, block.head);

  const T* k_tile = Packed::block(p, block.batch, block.head_kv, kv_first / BLOCK_N);

  for (int64_t kv_begin = kv_first; kv_begin < kv_end;
       kv_begin += BLOCK_N, k_tile += Packed::BLOCK_ELEMENTS) {
    const T* v_t = k_tile + BLOCK_N * HEAD_DIM;
    const bool fully_visible =
        mask.block_fully_visible(q_begin, q_end, kv_begin, kv_begin + BLOCK_N);

    // S^T for this sub-group's rows: S_STRIPS x MATRIX_M keys at a time.
    for (int j0 = 0; j0 < BLOCK_N; j0 += S_STRIPS * MATRIX_M)
      matrix_product_to_slm<T, MATRIX_M, MATRIX_K, R, HEAD_DIM, S_STRIPS, /*ACCUMULATE=*/false,
                            GLOBAL>(sg, &s_t[j0][r0], BLOCK_M, k_tile + j0 * HEAD_DIM, HEAD_DIM,
                                    &q_t[0][r0], BLOCK_M);
    sycl::group_barrier(sg);

    // Pass 1: finished scores (scale, modifiers, mask) back in place, and their max.
    float block_max = NEG_INF;
    for (int c0 = 0; c0 < BLOCK_N; c0 += MATRIX_KEY_CHUNK) {
      float scores[MATRIX_KEY_CHUNK];
#pragma unroll
      for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) scores[j] = s_t[c0 + j][lid] * score_scale;
      if constexpr (FEATURES != 0) {
        float unused_grad[MATRIX_KEY_CHUNK];
        score_mod.apply<FEATURES>(scores, unused_grad, row, kv_begin + c0, 0, 1);
      }
      if (!fully_visible) mask.apply_to_keys(scores, row, kv_begin + c0);
#pragma unroll
      for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) {
        s_t[c0 + j][lid] = scores[j];
        block_max = sycl::fmax(block_max, scores[j]);
      }
    }
    // Pass 2: probabilities against the block's max, row sum, dropout; P^T in the dtype.
    const float rescale = softmax.raise_max(block_max);
    float block_sum = 0.f;
    for (int c0 = 0; c0 < BLOCK_N; c0 += MATRIX_KEY_CHUNK) {
      float probs[MATRIX_KEY_CHUNK];
#pragma unroll
      for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) {
        probs[j] = softmax.probability(s_t[c0 + j][lid]);
        block_sum += probs[j];
      }
      // After the row sum: dropout rescales P, not the softmax.
      if (c.dropout.enabled) {
        float factor[MATRIX_KEY_CHUNK];
        dropout_factors_for_keys<FEATURES>(dropout_draw<FEATURES>(c, block.batch_head),
            row, kv_begin + c0, factor);
#pragma unroll
        for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) probs[j] *= factor[j];
      }
#pragma unroll
      for (int j = 0; j < MATRIX_KEY_CHUNK; j += 2)
        p_t[(c0 + j) / 2][lid] = pack_pair(from_float<T>(probs[j]), from_float<T>(probs[j + 1]));
    }
    softmax.row_sum += block_sum;
    for (int d = 0; d < HEAD_DIM; ++d) acc_t[d][lid] *= rescale;
    sycl::group_barrier(sg);

    // O^T += V^T . P^T for this sub-group's rows, O_STRIPS x MATRIX_M head-dim rows at a time.
    for (int d0 = 0; d0 < HEAD_DIM; d0 += O_STRIPS * MATRIX_M)
      matrix_product_to_slm<T, MATRIX_M, MATRIX_K, R, BLOCK_N, O_STRIPS, /*ACCUMULATE=*/true,
                            GLOBAL>(sg, &acc_t[d0][r0], BLOCK_M, v_t + d0 * BLOCK_N, BLOCK_N,
                                    &p_t[0][r0], BLOCK_M);
    sycl::group_barrier(sg);
  }

  write_output_row<T>(p, block, lid, acc_t, softmax, descale.v);
}

}  // namespace ipex_flash
