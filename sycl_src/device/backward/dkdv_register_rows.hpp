// The dK/dV register kernel's walk over the query rows that see a key block
// (backward/dkdv_registers_kernel.hpp, whose comment gives the products and their order): S, P
// and dS for a slab of rows at a time, dV^T and dK^T accumulated in registers, the blocks split
// into lean and general forms (run_blocks).
#pragma once

#include <sycl/sycl.hpp>

#include "backward/column_grads.hpp"
#include "backward/key_columns.hpp"
#include "backward/matrix_shape.hpp"
#include "backward/pack_operands.hpp"
#include "backward/score_grads.hpp"
#include "common/block_schedule.hpp"
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
  // Tiles addressed by OR (Packed::OR_ADDRESSED) past d = 64: 1.7 instructions per DPAS fewer
  // at d = 128 on DG2 and Arrow Lake-H, where at d = 64 IGC's schedule gave 1.3 more; with a
  // bool mask at d = 128 it spilled 64 bytes (as softcap does either way): kept as sums there.
  constexpr bool OR_OFFSETS =
      Packed::OR_ADDRESSED && HEAD_DIM > 64 && (FEATURES & FEATURE_MASK_BOOL) == 0;
  using Surface = PackedSurface<T, M, K, N, OR_OFFSETS>;
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
  // With every score change too, but on the 8-wide engines, where some spilled split
  // (split_blocks: DG2, Arrow Lake-H; docs/gpus.md).
  constexpr bool SPLIT = split_blocks<FEATURES, HEAD_DIM> || !Packed::TILED;
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
    // the user's mask included, in both). On the 8-wide engines, beside a float mask past
    // d = 64 every block takes the general form (SPLIT).
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

}  // namespace ipex_flash
