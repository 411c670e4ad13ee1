// The backward's dK/dV kernel with its tiles in registers, for the GPUs and emulation that run
// the dQ kernel so (backward/dq_registers_kernel.hpp; programs/flash_bwd_dkdv_registers.hpp builds
// both).
// Here a lane owns a key, its column of every tile (matrix/registers.hpp), and each sub-group
// its MATRIX_N keys of the work-group's block (or its share of their head dims: SHARES, the
// 8-wide engines past d = 32): sub-groups share nothing (each votes on the mask alone,
// AttnMaskPlane::hides_lines).
// Per query block, MATRIX_K rows (a slab) at a time, in this order (legend as in
// backward/matrix_kernels.hpp):
//   S (r, kv)  = Q (r, d) . K^T (d, kv)         SLAB / MATRIX_M accumulators
//   P (r, kv)                                   each lane on its key's column, a B operand
//   dV^T (d, kv) += dO^T (d, r) . P (r, kv)     HEAD_DIM / MATRIX_M accumulators, resident
//   dP (r, kv) = dO (r, d) . V^T (d, kv)        SLAB / MATRIX_M accumulators
//   dS (r, kv)                                  from P and dP, a B operand
//   dK^T (d, kv) += Q^T (d, r) . dS (r, kv)     HEAD_DIM / MATRIX_M accumulators, resident
// (backward/column_grads.hpp). Up to d = 64 in one walk over the rows; past it dK^T and dV^T would
// take all 256 registers (128 each at d = 128), so the kernel walks the rows twice: S, P and dV
// with dV^T resident, then dP, S, P, dS and dK with dK^T resident (dkdv_register_rows).
// Q, dO, Q^T and dO^T are read by coordinates within their block of the packed copy, K^T and V^T
// as B tiles from theirs (backward/pack_operands.hpp, REGISTERS); the A operands in 2-D blocks of
// four DPAS (matrix/block_io.hpp: a load per tile cost its descriptor every DPAS), or on the
// 8-wide engines (DG2, Arrow Lake-H, up to d = 128), which have no 2-D block loads, a tile per
// load from packs in tile order. The rows' LSE and delta are loaded one per lane and broadcast from
// the lane that holds them. Deterministic, no atomics.
#pragma once

#include <sycl/sycl.hpp>

#include "backward/column_grads.hpp"
#include "backward/key_columns.hpp"
#include "backward/matrix_shape.hpp"
#include "backward/pack_operands.hpp"
#include "backward/score_grads.hpp"
#include "common/block_schedule.hpp"
#include "common/kernel_props.hpp"
#include "common/params.hpp"
#include "backward/params.hpp"
#include "common/seq_info.hpp"
#include "score/block_mask.hpp"
#include "score/softcap_alibi.hpp"
#include "matrix/registers.hpp"

namespace ipex_flash {

// Which gradients a walk over the query rows accumulates (dkdv_register_rows).
enum DkdvGrads : int { DKDV_DV = 1, DKDV_DK = 2, DKDV_BOTH = DKDV_DV | DKDV_DK };

// What a walk over the query rows needs of the work-group's key block and the sub-group's keys.
struct DkdvKeys {
  SeqInfo seq;
  BlockMask mask;
  int batch, head_kv;
  int64_t kv_begin, kv_end, key;  // key: the lane's
  int64_t q_first, q_last;        // the query rows that can see any key of the block
  const uint32_t *k_t_pairs, *v_t_pairs;  // the sub-group's B tiles of K^T and V^T
  int d0;  // the first of the sub-group's rows (head dims) of dK^T and dV^T
};

// Accumulates the GRADS of the lane's key over every query row (and query head of its K/V
// head) that sees it, SLAB rows at a time: dV^T into dv, dK^T into dk (unscaled). A pass with
// one gradient reads only its own array; the caller may pass the same one for both.
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int M, int K, int N,
          int GRADS, int TILES>
__attribute__((always_inline)) inline void dkdv_register_rows(sycl::sub_group sg,
                                                              const BwdParams& p,
                                                              const DkdvKeys& kb,
                                                              MatrixAcc<M, N> (&dk)[TILES],
                                                              MatrixAcc<M, N> (&dv)[TILES]) {
  // One reduction step per slab (16 rows on GPUs): with two, the S and dP tiles beside the
  // resident dK^T and dV^T spilled at d = 64 on BMG and PVC.
  constexpr int SLAB = K, PART = N, PARTS = SLAB / PART;
  constexpr bool DV = (GRADS & DKDV_DV) != 0, DK = (GRADS & DKDV_DK) != 0;
  using Packed = PackedBwdFor<T, HEAD_DIM, BLOCK_M, BLOCK_N, /*REGISTERS=*/true, M, K, N>;
  using Surface = PackedSurface<T, M, K, N>;
  constexpr int KEY_GROUP = Packed::KEY_GROUP;
  static_assert(Packed::TILED == Surface::Order::TILED, "the pack is in the order it is read");
  // Q^T and dO^T are read at the slab's column of the query block's surface (their descriptors stay
  // put across slabs), but at d = 128 with score changes, where descriptors held through the slab
  // loop spilled (on BMG: docs/gpus.md): there the slab's columns are a surface of their own.
  // The 8-wide engines' tiled packs have no descriptors: a tile's address is its coordinates'.
  constexpr bool SHIFTED = HEAD_DIM > 64 && FEATURES != 0 && !Packed::TILED;
  const AttentionCommon& c = p.common;
  const SeqInfo& seq = kb.seq;
  const int lane = static_cast<int>(sg.get_local_id()[0]);
  // The query blocks that see the whole key block, run without the mask's code (run_blocks;
  // none under dropout). Computed per pass: held from the kernel's start, with the general
  // form's values, they spilled on the 8-wide engines.
  // With score changes too (split_blocks), but on the 8-wide engines: split there, with a mask
  // it spilled 192-992 bytes at d = 64 and 128 (DG2, Arrow Lake-H; docs/gpus.md).
  constexpr bool SPLIT = split_blocks<FEATURES> || !Packed::TILED;
  const BlockRun lean =
      SPLIT && !c.dropout.enabled
          ? kb.mask.fully_visible_row_blocks(kb.kv_begin, kb.kv_begin + BLOCK_N, kb.q_first,
                                             kb.q_last, BLOCK_M, seq.len_q)
          : BlockRun::none(kb.q_first);
  for (int h = kb.head_kv * c.dims.heads_per_kv; h < (kb.head_kv + 1) * c.dims.heads_per_kv;
       ++h) {
    const int64_t batch_head = static_cast<int64_t>(kb.batch) * c.dims.heads_q + h;
    const ScoreMod score_mod = ScoreMod::of(c, seq, kb.batch, h, p.mask_bits);
    const int64_t row_block0 = Packed::first_row_block(p, kb.batch, h);
    // One query block, in either form of run_blocks (score/block_mask.hpp): GENERAL for the
    // blocks the mask cuts through and every block under dropout, the lean form for the
    // others, without the mask's or dropout's code (backward/column_grads.hpp; score changes,
    // the user's mask included, in both). On the 8-wide engines, with score changes every
    // block takes the general form (SPLIT).
    const auto q_block = [&](auto general, int64_t q_begin) __attribute__((always_inline)) {
      constexpr bool GENERAL = decltype(general)::value;
      // The general form takes the lane's key and the mask's bounds through a sub-group
      // broadcast per block, which IGC does not hoist out of the loops: values it derived from
      // them there stayed live through the lean loop and spilled on the 8-wide engines (DG2,
      // Arrow Lake-H at d = 64). The lean form reads neither.
      const auto uniform = [&](auto value) { return sycl::group_broadcast(sg, value, 0); };
      const int64_t key = GENERAL ? uniform(kb.key) + lane : kb.key;
      const BlockMask mask =
          GENERAL ? BlockMask{uniform(kb.mask.diag), uniform(kb.mask.window_left),
                              uniform(kb.mask.window_right), uniform(kb.mask.len_k)}
                  : kb.mask;
      // (A fully visible block is whole: fully_visible_row_blocks.)
      const int64_t q_end = GENERAL ? std::min<int64_t>(q_begin + BLOCK_M, seq.len_q)
                                    : q_begin + BLOCK_M;
      if (score_mod.attn_mask.hides_lines<FEATURES, BLOCK_M, N>(
              sg, key < kb.kv_end, q_begin, key, 1, 0, static_cast<int>(q_end - q_begin)))
        return;
      const typename Packed::Rows rows = Packed::rows(p, row_block0 + q_begin / BLOCK_M);
      const bool fully_visible =
          !GENERAL ||
          mask.block_fully_visible(q_begin, q_end, kb.kv_begin, kb.kv_begin + BLOCK_N);
      const Surface q_rows{rows.q, BLOCK_M, HEAD_DIM, HEAD_DIM};
      const Surface do_rows{rows.dout, BLOCK_M, HEAD_DIM, HEAD_DIM};
      const Surface q_cols{rows.q_cols, HEAD_DIM, BLOCK_M, BLOCK_M};
      const Surface do_cols{rows.do_cols, HEAD_DIM, BLOCK_M, BLOCK_M};
#pragma unroll 1
      for (int slab = 0; slab < BLOCK_M && q_begin + slab < kb.q_last; slab += SLAB) {
        // P, then dV; dP, then dS and dK, on each lane's column of the slab's rows
        // (backward/column_grads.hpp). P and dS are rounded once, into the B operands (single
        // joint_matrix variables: IGC drops one reached in an array of one). The rows'
        // statistics: lane j loads row j of each part.
        const int64_t row0 = q_begin + slab;
        const int col = SHIFTED ? 0 : slab;
        const auto slab_cols = [&](const Surface& cols) {
          return SHIFTED ? Surface{cols.base + slab, HEAD_DIM, SLAB, BLOCK_M} : cols;
        };
        // On the 8-wide engines the sub-group barrier (no instruction there) keeps IGC from
        // hoisting the loop-invariant K^T and V^T B tiles out of the row loop, where held
        // beside the resident accumulators they would spill (as in the register dQ kernel).
        if constexpr (Packed::TILED) sycl::group_barrier(sg);
        float lse_lane[PARTS], delta_lane[PARTS];
IPEX_FLASH_TILE_LOOP
        for (int r = 0; r < PARTS; ++r) {
          const BwdRowStats stats = BwdRowStats::of(p, seq, kb.batch, h, row0 + r * PART + lane);
          lse_lane[r] = stats.lse_log2;
          delta_lane[r] = stats.delta * bwd_column_unit<FEATURES>;
        }
        // dK alone: dP first, so that only its column, not S's tiles, waits through the
        // score changes. The rows' statistics and the score changes go a part of PART rows
        // (one per lane) at a time, each rounded into the B operand's column as it is done: on
        // the 8-wide engines a whole slab's worth of each (a register per row) spilled beside
        // the resident dK^T and dV^T.
        float qk[SLAB], softcap_grad[SLAB], grad[SLAB];  // S (then P), d score, dP (then dS)
        T operand[SLAB];  // P (dropped) or dS in the dtype: the column of a B operand
        const auto part = [](float(&column)[SLAB], int r) -> float(&)[PART] {
          return *reinterpret_cast<float(*)[PART]>(column + r);
        };
        if constexpr (!DV)
          slab_product_columns<T, M, K, N, HEAD_DIM, KEY_GROUP>(sg, do_rows, slab,
                                                                kb.v_t_pairs, grad);
        slab_product_columns<T, M, K, N, HEAD_DIM, KEY_GROUP>(sg, q_rows, slab, kb.k_t_pairs,
                                                              qk);
IPEX_FLASH_TILE_LOOP
        for (int r = 0; r < SLAB; r += PART) {
          float lse_log2[PART], dropped[PART];
          broadcast_lanes(sg, lse_lane[r / PART], lse_log2);
          bwd_column_probabilities<FEATURES, N, GENERAL>(
              sg, c, score_mod, mask, fully_visible, batch_head, row0 + r, key, lse_log2,
              part(qk, r), part(softcap_grad, r), dropped);
          if constexpr (DV) {
            round_into(dropped, operand + r);
          } else {
            float delta[PART];
            broadcast_lanes(sg, delta_lane[r / PART], delta);
            bwd_column_dscores_kept<FEATURES, GENERAL>(c, part(qk, r), dropped,
                                                       part(softcap_grad, r), delta,
                                                       part(grad, r));
            round_into(part(grad, r), operand + r);
          }
        }
        if constexpr (DV) {
          MatrixBRegisters<T, K, N> p_b;
          matrix_b_from_column<K>(sg, p_b, operand);
          slab_gradient_step<T, M, K, N, TILES>(sg, dv, slab_cols(do_cols), kb.d0, col, p_b);
        }
        if constexpr (DV && DK) {
          slab_product_columns<T, M, K, N, HEAD_DIM, KEY_GROUP>(sg, do_rows, slab,
                                                                kb.v_t_pairs, grad);
IPEX_FLASH_TILE_LOOP
          for (int r = 0; r < SLAB; r += PART) {
            float delta[PART];
            broadcast_lanes(sg, delta_lane[r / PART], delta);
            bwd_column_dscores<FEATURES, N, GENERAL>(sg, c, batch_head, row0 + r, key,
                                                     part(qk, r), part(softcap_grad, r), delta,
                                                     part(grad, r));
            round_into(part(grad, r), operand + r);
          }
        }
        if constexpr (DK) {
          MatrixBRegisters<T, K, N> ds_b;
          matrix_b_from_column<K>(sg, ds_b, operand);
          slab_gradient_step<T, M, K, N, TILES>(sg, dk, slab_cols(q_cols), kb.d0, col, ds_b);
        }
      }
    };
    run_blocks<SPLIT>(kb.q_first, kb.q_last, BLOCK_M, lean, q_block);
  }
}

// SHARES sub-groups per MATRIX_N keys (the host's bwd_shares: on the 8-wide engines two past
// d = 32, and past d = 64 enough for at most 32 rows each; else one), each holding its
// HEAD_DIM / SHARES rows (head dims) of dK^T and dV^T and computing the keys' S, P, dP and dS
// alike (the same arithmetic: the same results). The work-group is BLOCK_N x SHARES work-items.
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N, int SHARES>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<MATRIX_N>))
IPEX_FLASH_REGISTER_FILE
void flash_bwd_dkdv_matrix_registers_kernel(BwdParams p) {
  constexpr int M = MATRIX_M, K = MATRIX_K, N = MATRIX_N;
  constexpr int SHARE_ROWS = HEAD_DIM / SHARES, ACC_TILES = SHARE_ROWS / M;
  // dK^T and dV^T take SHARE_ROWS / M x M registers each (fp32, a register per row of N
  // lanes): at d = 128 on the 16-wide engines, 128 each, the whole register file together. Past
  // d = 64 there (past 16 on the 8-wide engines, whose file is 128 registers of 32 bytes: at
  // d = 32, 32 each beside the slab's columns spilled on DG2: gpu-check's record) the kernel
  // walks the query rows twice, dV first, then dK, with one of them resident at a time: S and P
  // are computed twice (a quarter more products), where holding both would spill.
  constexpr bool TWO_PASSES = SHARE_ROWS > (N == 8 ? 16 : 64);
  static_assert(bwd_matrix_shape<HEAD_DIM, BLOCK_M, BLOCK_N, MATRIX_M, MATRIX_K, MATRIX_N>() &&
                    BLOCK_M % K == 0 && BLOCK_N % N == 0 && K % MATRIX_KEY_CHUNK == 0 &&
                    K % N == 0 && SHARE_ROWS % M == 0,
                "tile shape: a slab of rows is whole parts of the lanes' statistics, a share "
                "whole tiles");

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto sg = item.get_sub_group();
  const int item_id = static_cast<int>(item.get_local_id(0));
  const int lid = SHARES == 1 ? item_id : item_id % BLOCK_N;  // the key's in the block
  const int share = SHARES == 1 ? 0 : item_id / BLOCK_N;
  const int d0 = share * SHARE_ROWS;  // the share's first head dim
  // The sub-group's first key within the block, broadcast from lane 0: IGC then knows it is
  // the same in every lane (lid minus the lane's index it did not, and held the K^T and V^T
  // tile pointers below per lane, 64-bit, through both passes: they spilled).
  const int key0 = sycl::group_broadcast(sg, lid, 0);
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), c.num_blocks,
                                       c.dims.heads_kv(), /*reverse_blocks=*/false);
  const int b = coord.batch, h_kv = coord.head;
  const SeqInfo seq = seq_info(c, b);
  const int64_t kv_begin = static_cast<int64_t>(coord.block) * BLOCK_N;
  if (kv_begin >= seq.len_k) return;  // the whole work-group leaves together
  const int64_t kv_end = std::min<int64_t>(kv_begin + BLOCK_N, seq.len_k);
  using Packed = PackedBwdFor<T, HEAD_DIM, BLOCK_M, BLOCK_N, /*REGISTERS=*/true, M, K, N>;
  const typename Packed::Keys keys = Packed::keys(p, b, h_kv, coord.block);
  // What the stores at the end need, taken from the parameters now: kept instead, the
  // parameter block spilled beside the resident accumulators (BMG, softcap + ALiBi + mask).
  const struct {
    T *dk, *dv;
    int64_t dk_row, dv_row;
    float scale;
    int head_dim, head_dim_v, keys;  // keys: how many of the block's keys are in the sequence
  } out{static_cast<T*>(p.dk) + b * p.dk_stride.batch + h_kv * p.dk_stride.head +
            (seq.k_row0 + kv_begin) * p.dk_stride.row + d0,
        static_cast<T*>(p.dv) + b * p.dv_stride.batch + h_kv * p.dv_stride.head +
            (seq.k_row0 + kv_begin) * p.dv_stride.row + d0,
        p.dk_stride.row, p.dv_stride.row, c.scale, c.dims.head_dim - d0, c.dims.head_dim_v - d0,
        static_cast<int>(kv_end - kv_begin)};
  const BlockMask mask = BlockMask::of(c.mask, seq);
  const DkdvKeys kb{seq,
                    mask,
                    b,
                    h_kv,
                    kv_begin,
                    kv_end,
                    kv_begin + lid,
                    mask.first_row(kv_begin) / BLOCK_M * BLOCK_M,
                    mask.end_row(kv_end, seq.len_q),
                    Packed::key_columns(keys.k_t_pairs, key0),
                    Packed::key_columns(keys.v_t_pairs, key0),
                    d0};
  using Acc = MatrixAcc<M, N>;
  if constexpr (TWO_PASSES) {
    Acc grad[ACC_TILES];
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < ACC_TILES; ++t) matrix_fill(sg, grad[t], 0.f);
    dkdv_register_rows<T, HEAD_DIM, BLOCK_M, BLOCK_N, FEATURES, M, K, N, DKDV_DV>(sg, p, kb, grad,
                                                                                   grad);
    store_key_row<M>(sg, grad, out.dv + lid * out.dv_row, out.head_dim_v, 1.f, lid < out.keys);
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < ACC_TILES; ++t) matrix_fill(sg, grad[t], 0.f);
    dkdv_register_rows<T, HEAD_DIM, BLOCK_M, BLOCK_N, FEATURES, M, K, N, DKDV_DK>(sg, p, kb, grad,
                                                                                   grad);
    store_key_row<M>(sg, grad, out.dk + lid * out.dk_row, out.head_dim, out.scale, lid < out.keys);
  } else {
    Acc dk[ACC_TILES], dv[ACC_TILES];
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < ACC_TILES; ++t) {
      matrix_fill(sg, dk[t], 0.f);
      matrix_fill(sg, dv[t], 0.f);
    }
    dkdv_register_rows<T, HEAD_DIM, BLOCK_M, BLOCK_N, FEATURES, M, K, N, DKDV_BOTH>(sg, p, kb,
                                                                                     dk, dv);
    float dk_row[SHARE_ROWS], dv_row[SHARE_ROWS];
    lane_row_of_tiles<M>(sg, dk, dk_row);
    lane_row_of_tiles<M>(sg, dv, dv_row);
    if (lid >= out.keys) return;
    T* const dk_out = out.dk + lid * out.dk_row;
    T* const dv_out = out.dv + lid * out.dv_row;
IPEX_FLASH_TILE_LOOP
    for (int d = 0; d < SHARE_ROWS; ++d) {
      if (d < out.head_dim) dk_out[d] = from_float<T>(dk_row[d] * out.scale);
      if (d < out.head_dim_v) dv_out[d] = from_float<T>(dv_row[d]);
    }
  }
}

}  // namespace ipex_flash
