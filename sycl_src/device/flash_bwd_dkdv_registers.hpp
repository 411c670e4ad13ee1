// The backward's dK/dV kernel with its tiles in registers, for the GPUs and emulation that run
// the dQ kernel so (flash_bwd_dq_registers.hpp, included: this header is the program of both).
// Here a lane owns a key, its column of every tile (matrix_registers.hpp), and each sub-group
// its MATRIX_N keys of the work-group's block: sub-groups share nothing (each votes on the
// mask alone, AttnMaskPlane::hides_lines).
// Per query block, MATRIX_K rows (a slab) at a time, in this order (legend as in
// flash_bwd_matrix.hpp):
//   S (r, kv)  = Q (r, d) . K^T (d, kv)         SLAB / MATRIX_M accumulators
//   P (r, kv)                                   each lane on its key's column, a B operand
//   dV^T (d, kv) += dO^T (d, r) . P (r, kv)     HEAD_DIM / MATRIX_M accumulators, resident
//   dP (r, kv) = dO (r, d) . V^T (d, kv)        SLAB / MATRIX_M accumulators
//   dS (r, kv)                                  from P and dP, a B operand
//   dK^T (d, kv) += Q^T (d, r) . dS (r, kv)     HEAD_DIM / MATRIX_M accumulators, resident
// (bwd_column_grads.hpp).
// Q, dO, Q^T and dO^T are read by coordinates within their block of the packed copy, K^T and V^T
// as B tiles from theirs (bwd_packed.hpp, REGISTERS). The rows' LSE and delta are loaded one per
// lane and broadcast from the lane that holds them. Deterministic, no atomics.
#pragma once

#include <sycl/sycl.hpp>

#include "bwd_column_grads.hpp"
#include "flash_bwd_dq_registers.hpp"
#include "matrix_registers.hpp"

namespace ipex_flash {

// Element j of chunk c of `values` is lane j's lane_values[c] (a row statistic loaded by the
// lane that owns the row): the lane index is a constant, which the GPU compiler reads as a
// register region.
template <int CHUNKS>
__attribute__((always_inline)) inline void broadcast_chunks(
    sycl::sub_group sg, const float (&lane_values)[CHUNKS],
    float (&values)[CHUNKS * MATRIX_KEY_CHUNK]) {
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
    for (int j = 0; j < MATRIX_KEY_CHUNK; ++j)
      values[c * MATRIX_KEY_CHUNK + j] = sycl::select_from_group(sg, lane_values[c], j);
}

// The lane's column of the score tiles (S or dP) over a whole slab of rows, chunk by chunk.
template <int M, int SLAB, typename Acc, int TILES>
__attribute__((always_inline)) inline void slab_of_columns(sycl::sub_group sg,
                                                           Acc (&tiles)[TILES],
                                                           float (&column)[SLAB]) {
#pragma unroll
  for (int c0 = 0; c0 < SLAB; c0 += MATRIX_KEY_CHUNK) {
    float chunk[MATRIX_KEY_CHUNK];
    chunk_of_columns<M>(sg, tiles, c0, chunk);
#pragma unroll
    for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) column[c0 + j] = chunk[j];
  }
}

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<MATRIX_N>))
IPEX_FLASH_REGISTER_FILE
void flash_bwd_dkdv_matrix_registers_kernel(BwdParams p) {
  constexpr int M = MATRIX_M, K = MATRIX_K, N = MATRIX_N;
  // One reduction step per slab (16 rows on GPUs): with two, the S and dP tiles beside the
  // resident dK^T and dV^T spilled at d = 64 on BMG and PVC.
  constexpr int SLAB = K, CHUNKS = SLAB / MATRIX_KEY_CHUNK;
  constexpr int S_TILES = SLAB / M, ACC_TILES = HEAD_DIM / M;
  static_assert(bwd_matrix_shape<HEAD_DIM, BLOCK_M, BLOCK_N, MATRIX_M, MATRIX_K, MATRIX_N>() &&
                    BLOCK_M % SLAB == 0 && BLOCK_N % N == 0 && SLAB % MATRIX_KEY_CHUNK == 0 &&
                    N == MATRIX_KEY_CHUNK,
                "tile shape: a chunk of rows is one lane's broadcast of their statistics");
  constexpr auto GLOBAL = sycl::access::address_space::global_space;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto sg = item.get_sub_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const int lane = static_cast<int>(sg.get_local_id()[0]);
  const int key0 = lid - lane;  // the sub-group's first key within the block
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), c.num_blocks,
                                       c.dims.heads_kv(), /*reverse_blocks=*/false);
  const int b = coord.batch, h_kv = coord.head;
  const SeqInfo seq = seq_info(c, b);
  const int64_t kv_begin = static_cast<int64_t>(coord.block) * BLOCK_N;
  if (kv_begin >= seq.len_k) return;  // the whole work-group leaves together
  const int64_t kv_end = std::min<int64_t>(kv_begin + BLOCK_N, seq.len_k);
  const int64_t key = kv_begin + lid;
  using Packed = PackedBwd<T, HEAD_DIM, BLOCK_M, BLOCK_N, /*REGISTERS=*/true>;
  const typename Packed::Keys keys = Packed::keys(p, b, h_kv, coord.block);
  // What the stores at the end need, taken from the parameters now: kept instead, the
  // parameter block spilled beside the resident accumulators (BMG, softcap + ALiBi + mask).
  const struct {
    T *dk, *dv;
    int64_t dk_row, dv_row;
    float scale;
    int head_dim, head_dim_v, keys;  // keys: how many of the block's keys are in the sequence
  } out{static_cast<T*>(p.dk) + b * p.dk_stride.batch + h_kv * p.dk_stride.head +
            (seq.k_row0 + kv_begin) * p.dk_stride.row,
        static_cast<T*>(p.dv) + b * p.dv_stride.batch + h_kv * p.dv_stride.head +
            (seq.k_row0 + kv_begin) * p.dv_stride.row,
        p.dk_stride.row, p.dv_stride.row, c.scale, c.dims.head_dim, c.dims.head_dim_v,
        static_cast<int>(kv_end - kv_begin)};

  MatrixAcc<M, N> dk[ACC_TILES], dv[ACC_TILES];
#pragma unroll
  for (int t = 0; t < ACC_TILES; ++t) {
    matrix_fill(sg, dk[t], 0.f);
    matrix_fill(sg, dv[t], 0.f);
  }
  const BlockMask mask = BlockMask::of(c.mask, seq);
  const int64_t q_first = mask.first_row(kv_begin) / BLOCK_M * BLOCK_M;
  const int64_t q_last = mask.end_row(kv_end, seq.len_q);  // rows past it see no key here

  for (int h = h_kv * c.dims.heads_per_kv; h < (h_kv + 1) * c.dims.heads_per_kv; ++h) {
    const int64_t batch_head = static_cast<int64_t>(b) * c.dims.heads_q + h;
    const ScoreMod score_mod = ScoreMod::of(c, seq, b, h);
    const int64_t row_block0 = Packed::first_row_block(p, b, h);
    for (int64_t q_begin = q_first; q_begin < q_last; q_begin += BLOCK_M) {
      const int64_t q_end = std::min<int64_t>(q_begin + BLOCK_M, seq.len_q);
      if (score_mod.attn_mask.hides_lines<FEATURES>(sg, key < kv_end, q_begin, key, 1, 0,
                                                    q_end - q_begin))
        continue;
      const typename Packed::Rows rows = Packed::rows(p, row_block0 + q_begin / BLOCK_M);
      const bool fully_visible = IPEX_FLASH_UNLESS_MEASURED(
          mask.block_fully_visible(q_begin, q_end, kv_begin, kv_begin + BLOCK_N), true);
      const MatrixSurface<T> q_rows{rows.q, BLOCK_M, HEAD_DIM, HEAD_DIM};
      const MatrixSurface<T> do_rows{rows.dout, BLOCK_M, HEAD_DIM, HEAD_DIM};
#pragma unroll 1
      for (int slab = 0; slab < BLOCK_M && q_begin + slab < q_last; slab += SLAB) {
        // P, then dV; dP, then dS and dK, on each lane's column of the slab's rows
        // (bwd_column_grads.hpp). P and dS are rounded once, into the B operands (single
        // joint_matrix variables: IGC drops one reached in an array of one). The rows'
        // statistics: lane j loads row j of each chunk.
        const int64_t row0 = q_begin + slab;
        float lse_lane[CHUNKS], delta_lane[CHUNKS];
#pragma unroll
        for (int c0 = 0; c0 < CHUNKS; ++c0) {
          const BwdRowStats stats =
              BwdRowStats::of(p, seq, b, h, row0 + c0 * MATRIX_KEY_CHUNK + lane);
          lse_lane[c0] = stats.lse_log2;
          delta_lane[c0] = stats.delta;
        }
        const MatrixSurface<T> do_cols{rows.do_cols + slab, HEAD_DIM, SLAB, BLOCK_M};
        const MatrixSurface<T> q_cols{rows.q_cols + slab, HEAD_DIM, SLAB, BLOCK_M};
        float prob[SLAB], softcap_grad[SLAB];
        {
          MatrixAcc<M, N> s[S_TILES];
#pragma unroll
          for (int t = 0; t < S_TILES; ++t) matrix_fill(sg, s[t], 0.f);
          matrix_mad_surface<T, M, K, N, HEAD_DIM, S_TILES, GLOBAL>(sg, s, q_rows, slab,
                                                                    keys.k_t_pairs + key0, BLOCK_N);
          slab_of_columns<M>(sg, s, prob);
          float lse_log2[SLAB], dropped[SLAB];
          broadcast_chunks(sg, lse_lane, lse_log2);
          bwd_column_probabilities<FEATURES>(c, score_mod, mask, fully_visible, batch_head, row0,
                                             key, lse_log2, prob, softcap_grad, dropped);
          MatrixBRegisters<T, K, N> p_b;
          matrix_b_from_floats<K, T>(sg, p_b, dropped);
          matrix_mad_surface_step<T, M, K, N, ACC_TILES>(sg, dv, do_cols, 0, p_b);
        }
        MatrixAcc<M, N> dp[S_TILES];
#pragma unroll
        for (int t = 0; t < S_TILES; ++t) matrix_fill(sg, dp[t], 0.f);
        matrix_mad_surface<T, M, K, N, HEAD_DIM, S_TILES, GLOBAL>(sg, dp, do_rows, slab,
                                                                  keys.v_t_pairs + key0, BLOCK_N);
        float grad[SLAB], delta[SLAB];
        slab_of_columns<M>(sg, dp, grad);
        broadcast_chunks(sg, delta_lane, delta);
        bwd_column_dscores<FEATURES>(c, batch_head, row0, key, prob, softcap_grad, delta, grad);
        MatrixBRegisters<T, K, N> ds_b;
        matrix_b_from_floats<K, T>(sg, ds_b, grad);
        matrix_mad_surface_step<T, M, K, N, ACC_TILES>(sg, dk, q_cols, 0, ds_b);
      }
    }
  }

  float dk_row[HEAD_DIM], dv_row[HEAD_DIM];
  lane_row_of_tiles<M>(sg, dk, dk_row);
  lane_row_of_tiles<M>(sg, dv, dv_row);
  if (lid >= out.keys) return;
  T* const dk_out = out.dk + lid * out.dk_row;
  T* const dv_out = out.dv + lid * out.dv_row;
#pragma unroll
  for (int d = 0; d < HEAD_DIM; ++d) {
    if (d < out.head_dim) dk_out[d] = from_float<T>(dk_row[d] * out.scale);
    if (d < out.head_dim_v) dv_out[d] = from_float<T>(dv_row[d]);
  }
}

}  // namespace ipex_flash
