// FlashAttention-2 backward with its five products on the matrix engine (XMX on Intel GPUs, AMX
// on Xeons), for 16-bit inputs: the blocks, masks, score modifiers, dropout and GQA sums of
// backward/vector_kernels.hpp, and like it deterministic (no atomics). Dimension legend as in
// forward/matrix_kernel.hpp. Both kernels give each work-item one query row of a BLOCK_M-row
// block (MATRIX_N rows per sub-group: 16, or 8 on DG2 / Arrow Lake-H) and compute transposed,
// row index fastest, so that the per-score work (backward/score_grads.hpp) reads and writes
// consecutive addresses:
//   S^T (kv, r)  = K (kv, d) . Q^T (d, r)         both kernels
//   dP^T (kv, r) = V (kv, d) . dO^T (d, r)        both kernels
//   dV (kv, d)  += P^T (kv, q) . dO (q, d)        dK/dV kernel, all rows of the Q block
//   dK (kv, d)  += dS^T (kv, q) . Q (q, d)        dK/dV kernel
//   dQ^T (d, r) += K^T (d, kv) . dS^T (kv, r)     dQ kernel
// with fp32 accumulators and P, dS rounded to the input dtype before their products, as
// FlashAttention-2 does on GPUs. Every operand read from global memory comes from the copies
// backward/pack_operands.hpp writes once per call; the tiles computed here stay in SLM.
#pragma once

#include <sycl/sycl.hpp>

#include "common/block_schedule.hpp"
#include "backward/pack_operands.hpp"
#include "backward/score_grads.hpp"
#include "backward/matrix_shape.hpp"
#include "common/kernel_props.hpp"
#include "score/block_mask.hpp"
#include "matrix/slm_tile.hpp"
#include "common/params.hpp"
#include "backward/params.hpp"
#include "score/softcap_alibi.hpp"
#include "common/seq_info.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// S^T and dP^T of one (Q block, K block) for the calling sub-group's MATRIX_N rows (columns
// r0..).
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int MATRIX_M, int MATRIX_K,
          int MATRIX_N, typename Packed>
inline void bwd_scores_to_slm(sycl::sub_group sg, float (&s_t)[BLOCK_N][BLOCK_M],
                              float (&dp_t)[BLOCK_N][BLOCK_M], const typename Packed::Keys& keys,
                              const typename Packed::Rows& rows, int r0) {
  constexpr auto GLOBAL = sycl::access::address_space::global_space;
  constexpr int STRIPS = matrix_strips(BLOCK_N / MATRIX_M);
  constexpr int UNROLL = bwd_unroll<MATRIX_N, HEAD_DIM, MATRIX_K>();
  constexpr bool TILED = Packed::TILED;
  constexpr int LDB = Packed::COLUMN_GROUP;
  for (int j0 = 0; j0 < BLOCK_N; j0 += STRIPS * MATRIX_M) {
    matrix_product_to_slm<T, MATRIX_M, MATRIX_K, MATRIX_N, HEAD_DIM, STRIPS, /*ACCUMULATE=*/false,
                          GLOBAL, GLOBAL, UNROLL, TILED>(sg, &s_t[j0][r0], BLOCK_M,
                                                         keys.k + j0 * HEAD_DIM, HEAD_DIM,
                                                         Packed::columns(rows.q_t, r0), LDB);
    matrix_product_to_slm<T, MATRIX_M, MATRIX_K, MATRIX_N, HEAD_DIM, STRIPS, /*ACCUMULATE=*/false,
                          GLOBAL, GLOBAL, UNROLL, TILED>(sg, &dp_t[j0][r0], BLOCK_M,
                                                         keys.v + j0 * HEAD_DIM, HEAD_DIM,
                                                         Packed::columns(rows.do_t, r0), LDB);
  }
}

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<MATRIX_N>))
IPEX_FLASH_REGISTER_FILE
void flash_bwd_dkdv_matrix_kernel(BwdParams p) {
  static_assert(bwd_matrix_shape<HEAD_DIM, BLOCK_M, BLOCK_N, MATRIX_M, MATRIX_K, MATRIX_N>(),
                "tile shape");
  static syclexp::work_group_static<float[BLOCK_N][BLOCK_M]> s_slm;     // S^T (kv, q)
  static syclexp::work_group_static<float[BLOCK_N][BLOCK_M]> dp_slm;    // dP^T (kv, q)
  static syclexp::work_group_static<T[BLOCK_N][BLOCK_M]> p_slm;         // P^T, dropped
  static syclexp::work_group_static<T[BLOCK_N][BLOCK_M]> ds_slm;        // dS^T
  static syclexp::work_group_static<float[BLOCK_N][HEAD_DIM]> dk_slm;   // (kv, d) accumulator
  static syclexp::work_group_static<float[BLOCK_N][HEAD_DIM]> dv_slm;   // (kv, d) accumulator
  static syclexp::work_group_static<float> visible_slm;                 // any_visible's vote
  float& visible = visible_slm;
  float(&s_t)[BLOCK_N][BLOCK_M] = s_slm;
  float(&dp_t)[BLOCK_N][BLOCK_M] = dp_slm;
  T(&p_rows)[BLOCK_N][BLOCK_M] = p_slm;
  T(&ds_rows)[BLOCK_N][BLOCK_M] = ds_slm;
  float(&dk_acc)[BLOCK_N][HEAD_DIM] = dk_slm;
  float(&dv_acc)[BLOCK_N][HEAD_DIM] = dv_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto group = item.get_group();
  const auto sg = item.get_sub_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const int r0 = lid - static_cast<int>(sg.get_local_id()[0]);
  const int sg_id = r0 / MATRIX_N;
  constexpr int SUB_GROUPS = BLOCK_M / MATRIX_N;
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), c.num_blocks,
                                       c.dims.heads_kv(), /*reverse_blocks=*/false);
  const int b = coord.batch, h_kv = coord.head;
  const SeqInfo seq = seq_info(c, b);
  const int64_t kv_begin = static_cast<int64_t>(coord.block) * BLOCK_N;
  if (kv_begin >= seq.len_k) return;  // the whole work-group leaves together
  const int64_t kv_end = std::min<int64_t>(kv_begin + BLOCK_N, seq.len_k);
  using Packed = PackedBwdFor<T, HEAD_DIM, BLOCK_M, BLOCK_N, /*REGISTERS=*/false, MATRIX_M,
                              MATRIX_K, MATRIX_N>;
  const typename Packed::Keys keys = Packed::keys(p, b, h_kv, coord.block);
  constexpr auto GLOBAL = sycl::access::address_space::global_space;
  constexpr auto LOCAL = sycl::access::address_space::local_space;
  constexpr int ACC_STRIPS = matrix_strips(BLOCK_N / MATRIX_M);
  constexpr int ROW_UNROLL = bwd_unroll<MATRIX_N, BLOCK_M, MATRIX_K>();

  for (int r = 0; r < BLOCK_N; ++r)
    for (int d = lid; d < HEAD_DIM; d += BLOCK_M) dk_acc[r][d] = dv_acc[r][d] = 0.f;

  const BlockMask mask = BlockMask::of(c.mask, seq);
  const int64_t q_first = mask.first_row(kv_begin) / BLOCK_M * BLOCK_M;
  const int64_t q_last = mask.end_row(kv_end, seq.len_q);  // rows past it see no key here

  for (int h = h_kv * c.dims.heads_per_kv; h < (h_kv + 1) * c.dims.heads_per_kv; ++h) {
    const int64_t batch_head = static_cast<int64_t>(b) * c.dims.heads_q + h;
    const ScoreMod score_mod = ScoreMod::of(c, seq, b, h);
    const int64_t row_block0 = Packed::first_row_block(p, b, h);
    for (int64_t q_begin = q_first; q_begin < q_last; q_begin += BLOCK_M) {
      const int64_t q_end = std::min<int64_t>(q_begin + BLOCK_M, seq.len_q);
      if (score_mod.attn_mask.hides_block<FEATURES>(group, visible, q_begin, q_end, kv_begin,
                                                    kv_end, lid, BLOCK_M))
        continue;
      const typename Packed::Rows rows = Packed::rows(p, row_block0 + q_begin / BLOCK_M);
      bwd_scores_to_slm<T, HEAD_DIM, BLOCK_M, BLOCK_N, MATRIX_M, MATRIX_K, MATRIX_N, Packed>(
          sg, s_t, dp_t, keys, rows, r0);
      sycl::group_barrier(sg);

      const int64_t row = q_begin + lid;
      const BwdRowStats stats = BwdRowStats::of(p, seq, b, h, row);
      const bool fully_visible =
          mask.block_fully_visible(q_begin, q_end, kv_begin, kv_begin + BLOCK_N);
      for (int c0 = 0; c0 < BLOCK_N; c0 += MATRIX_KEY_CHUNK) {
        float qk[MATRIX_KEY_CHUNK], dp[MATRIX_KEY_CHUNK];
#pragma unroll
        for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) {
          qk[j] = s_t[c0 + j][lid];
          dp[j] = dp_t[c0 + j][lid];
        }
        bwd_score_grads<FEATURES>(c, score_mod, mask, fully_visible, batch_head, row,
                                  kv_begin + c0, stats, qk, dp);
#pragma unroll
        for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) {
          p_rows[c0 + j][lid] = from_float<T>(qk[j]);
          ds_rows[c0 + j][lid] = from_float<T>(dp[j]);
        }
      }
      sycl::group_barrier(group);  // dV and dK read every row's P and dS

      // Tiles of MATRIX_N head-dim columns dealt to the sub-groups, each over all BLOCK_N keys.
      for (int d0 = sg_id * MATRIX_N; d0 < HEAD_DIM; d0 += SUB_GROUPS * MATRIX_N)
        for (int j0 = 0; j0 < BLOCK_N; j0 += ACC_STRIPS * MATRIX_M) {
          matrix_product_to_slm<T, MATRIX_M, MATRIX_K, MATRIX_N, BLOCK_M, ACC_STRIPS,
                                /*ACCUMULATE=*/true, LOCAL, GLOBAL, ROW_UNROLL>(
              sg, &dv_acc[j0][d0], HEAD_DIM, &p_rows[j0][0], BLOCK_M,
              Packed::pair_columns(rows.do_pairs, d0), Packed::PAIR_GROUP);
          matrix_product_to_slm<T, MATRIX_M, MATRIX_K, MATRIX_N, BLOCK_M, ACC_STRIPS,
                                /*ACCUMULATE=*/true, LOCAL, GLOBAL, ROW_UNROLL>(
              sg, &dk_acc[j0][d0], HEAD_DIM, &ds_rows[j0][0], BLOCK_M,
              Packed::pair_columns(rows.q_pairs, d0), Packed::PAIR_GROUP);
        }
      sycl::group_barrier(group);  // P and dS are rewritten by the next block
    }
  }

  sycl::group_barrier(group);  // every accumulator column is complete
  for (int r = 0; r < kv_end - kv_begin; ++r) {
    const int64_t key_row = seq.k_row0 + kv_begin + r;
    T* dk = static_cast<T*>(p.dk) + b * p.dk_stride.batch + h_kv * p.dk_stride.head +
            key_row * p.dk_stride.row;
    T* dv = static_cast<T*>(p.dv) + b * p.dv_stride.batch + h_kv * p.dv_stride.head +
            key_row * p.dv_stride.row;
    for (int d = lid; d < c.dims.head_dim; d += BLOCK_M)
      dk[d] = from_float<T>(dk_acc[r][d] * c.scale);
    for (int d = lid; d < c.dims.head_dim_v; d += BLOCK_M)
      dv[d] = from_float<T>(dv_acc[r][d]);
  }
}

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<MATRIX_N>))
IPEX_FLASH_REGISTER_FILE
void flash_bwd_dq_matrix_kernel(BwdParams p) {
  static_assert(bwd_matrix_shape<HEAD_DIM, BLOCK_M, BLOCK_N, MATRIX_M, MATRIX_K, MATRIX_N>(),
                "tile shape");
  static syclexp::work_group_static<float[BLOCK_N][BLOCK_M]> s_slm;         // S^T (kv, q)
  static syclexp::work_group_static<float[BLOCK_N][BLOCK_M]> dp_slm;        // dP^T (kv, q)
  static syclexp::work_group_static<uint32_t[BLOCK_N / 2][BLOCK_M]> ds_slm;  // dS^T packed
  static syclexp::work_group_static<float[HEAD_DIM][BLOCK_M]> dq_slm;       // dQ^T (d, q)
  static syclexp::work_group_static<float> visible_slm;                     // any_visible's vote
  float& visible = visible_slm;
  float(&s_t)[BLOCK_N][BLOCK_M] = s_slm;
  float(&dp_t)[BLOCK_N][BLOCK_M] = dp_slm;
  uint32_t(&ds_t)[BLOCK_N / 2][BLOCK_M] = ds_slm;
  float(&dq_t)[HEAD_DIM][BLOCK_M] = dq_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto group = item.get_group();
  const auto sg = item.get_sub_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const int r0 = lid - static_cast<int>(sg.get_local_id()[0]);
  const QueryBlock block = query_block(c, static_cast<int64_t>(item.get_group(0)), BLOCK_M);
  if (block.empty) return;
  const SeqInfo& seq = block.seq;
  const int64_t q_begin = block.begin, q_end = block.end;
  const int64_t row = q_begin + lid;
  using Packed = PackedBwdFor<T, HEAD_DIM, BLOCK_M, BLOCK_N, /*REGISTERS=*/false, MATRIX_M,
                              MATRIX_K, MATRIX_N>;
  const typename Packed::Rows rows = Packed::rows(p, block.batch, block.head, q_begin / BLOCK_M);
  constexpr auto GLOBAL = sycl::access::address_space::global_space;
  // Two strips at a time where K^T is read tile by tile (the 8-wide engines): four spilled at
  // d = 128 with softcap, ALiBi and a mask (DG2, Arrow Lake-H; gpu-check's record).
  constexpr int DQ_STRIPS = Packed::TILED ? 2 : matrix_strips(HEAD_DIM / MATRIX_M);
  constexpr auto LOCAL = sycl::access::address_space::local_space;

  for (int d = 0; d < HEAD_DIM; ++d) dq_t[d][lid] = 0.f;
  const BlockMask mask = BlockMask::of(c.mask, seq);
  const ScoreMod score_mod = ScoreMod::of(c, seq, block.batch, block.head);
  const BwdRowStats stats = BwdRowStats::of(p, seq, block.batch, block.head, row);
  const int64_t kv_first = mask.first_key(q_begin) / BLOCK_N * BLOCK_N;
  const int64_t kv_end = mask.end_key(q_end);
  const int64_t key_block0 = Packed::first_key_block(p, block.batch, block.head_kv);

  for (int64_t kv_begin = kv_first; kv_begin < kv_end; kv_begin += BLOCK_N) {
    if (score_mod.attn_mask.hides_block<FEATURES>(group, visible, q_begin, q_end, kv_begin,
                                                  std::min<int64_t>(kv_begin + BLOCK_N, kv_end),
                                                  lid, BLOCK_M))
      continue;
    const typename Packed::Keys keys =
        Packed::keys(p, key_block0 + kv_begin / BLOCK_N);
    bwd_scores_to_slm<T, HEAD_DIM, BLOCK_M, BLOCK_N, MATRIX_M, MATRIX_K, MATRIX_N, Packed>(
        sg, s_t, dp_t, keys, rows, r0);
    sycl::group_barrier(sg);
    const bool fully_visible =
        mask.block_fully_visible(q_begin, q_end, kv_begin, kv_begin + BLOCK_N);
    for (int c0 = 0; c0 < BLOCK_N; c0 += MATRIX_KEY_CHUNK) {
      float qk[MATRIX_KEY_CHUNK], dp[MATRIX_KEY_CHUNK];
#pragma unroll
      for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) {
        qk[j] = s_t[c0 + j][lid];
        dp[j] = dp_t[c0 + j][lid];
      }
      bwd_score_grads<FEATURES>(c, score_mod, mask, fully_visible, block.batch_head, row,
                                kv_begin + c0, stats, qk, dp);
#pragma unroll
      for (int j = 0; j < MATRIX_KEY_CHUNK; j += 2)
        ds_t[(c0 + j) / 2][lid] = pack_pair(from_float<T>(dp[j]), from_float<T>(dp[j + 1]));
    }
    sycl::group_barrier(sg);
    for (int d0 = 0; d0 < HEAD_DIM; d0 += DQ_STRIPS * MATRIX_M)
      matrix_product_to_slm<T, MATRIX_M, MATRIX_K, MATRIX_N, BLOCK_N, DQ_STRIPS,
                            /*ACCUMULATE=*/true, GLOBAL, LOCAL,
                            bwd_unroll<MATRIX_N, BLOCK_N, MATRIX_K>(), Packed::TILED>(
          sg, &dq_t[d0][r0], BLOCK_M, keys.k_t + d0 * BLOCK_N, BLOCK_N, &ds_t[0][r0], BLOCK_M);
    sycl::group_barrier(sg);
  }

  if (row < seq.len_q) {
    T* dq = static_cast<T*>(p.dq) + block.batch * p.dq_stride.batch +
            block.head * p.dq_stride.head + (seq.q_row0 + row) * p.dq_stride.row;
    for (int d = 0; d < c.dims.head_dim; ++d) dq[d] = from_float<T>(dq_t[d][lid] * c.scale);
  }
}

}  // namespace ipex_flash
