// The backward's dQ kernel with its tiles in registers, for the GPUs and emulation that run the
// forward so (forward/registers_kernel.hpp, matrix/registers.hpp): the dK/dV kernel and the
// packs of backward/matrix_kernels.hpp with this dQ kernel in place of its SLM-staged one. Per
// K/V block and sub-group (lane r owns query row r; legend as in backward/matrix_kernels.hpp):
//   S^T (kv, r)  = K (kv, d) . Q^T (d, r)       BLOCK_N / MATRIX_M accumulators
//   dP^T (kv, r) = V (kv, d) . dO^T (d, r)      as many
//   dS^T (kv, r)                                each lane on its own column (bwd_score_grads),
//                                               B operands built in registers
//   dQ^T (d, r) += K^T (d, kv) . dS^T (kv, r)   HEAD_DIM / MATRIX_M accumulators, resident
// K, K^T and V are read by coordinates within their block of the packed copy, 2-D blocks of
// 16 or 32 rows by 32 columns feeding four or eight DPAS each where the slab's shape allows
// (matrix/block_io.hpp: a load per tile cost its descriptor every DPAS), Q^T and dO^T as
// B tiles from theirs (backward/pack_operands.hpp), in either layout of the packs
// (REGISTER_LAYOUT: the register dK/dV kernel's, or the SLM-staged one's where that kernel
// serves the head dim). On the 8-wide engines (DG2, Arrow Lake-H, up to d = 128), which have no
// 2-D block loads, the packs are tile by tile and each product reads one tile per load
// (matrix/surface.hpp). No SLM; deterministic, no atomics.
#pragma once

#include <sycl/sycl.hpp>

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
#include "matrix/block_io.hpp"
#include "matrix/registers.hpp"

namespace ipex_flash {

// SHARES sub-groups per MATRIX_N query rows (the host's bwd_shares: on the 8-wide engines two
// from d = 32, and past d = 64 enough for at most 32 rows each (three at d = 96, four at 128),
// whose 128 registers of 32 bytes a whole dQ^T at d = 64 beside the score tiles overflowed,
// spilling on DG2 (gpu-check's record); else one), each holding its share of dQ^T's
// rows (head dims) and computing the rows' S^T, dP^T and dS^T alike (the same arithmetic: the
// same results). The work-group is BLOCK_M x SHARES work-items.
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N, bool REGISTER_LAYOUT, int SHARES>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<MATRIX_N>))
IPEX_FLASH_REGISTER_FILE
void flash_bwd_dq_matrix_registers_kernel(BwdParams p) {
  static_assert(bwd_matrix_shape<HEAD_DIM, BLOCK_M, BLOCK_N, MATRIX_M, MATRIX_K, MATRIX_N>(),
                "tile shape");
  constexpr int M = MATRIX_M, K = MATRIX_K, R = MATRIX_N;
  // Keys a slab at a time: S^T and dP^T of 64 keys next to dQ^T at d = 128 would need all 256
  // registers (they spilled on BMG and PVC: gpu-check's record). Past d = 64 dQ^T alone takes 128
  // registers (16 tiles of 8 x 16 floats): the slab shrinks to one reduction step of dQ's product,
  // the fewest keys that still make two score tiles (16 on the GPUs).
  // The 8-wide engines (128 registers of 32 bytes; a share of dQ^T takes at most 32) take the
  // same short slabs at every head dim.
  // On the 8-wide engines a tile's address is its surface's start OR its offset where the pack's
  // tiles are powers of two (Packed::OR_ADDRESSED): 0.5-2.3 instructions per DPAS fewer on DG2
  // and Arrow Lake-H (gpu-check).
  using Packed = PackedBwdFor<T, HEAD_DIM, BLOCK_M, BLOCK_N, REGISTER_LAYOUT, M, K, R>;
  using Surface = PackedSurface<T, M, K, R, Packed::OR_ADDRESSED>;
  constexpr bool TILED = Surface::Order::TILED;
  constexpr int SLAB = HEAD_DIM > 64 || TILED ? (2 * M > K ? 2 * M : K)
                       : BLOCK_N % 32 == 0  ? 32
                                            : BLOCK_N;
  // dS is made CHUNK keys at a time; on the 8-wide engines one S^T tile's: with two, softcap's
  // values beside S^T and dP^T spilled at d = 64 (gpu-check's record).
  constexpr int CHUNK = R == 8 ? M : MATRIX_KEY_CHUNK;
  constexpr int DQ_ROWS = HEAD_DIM / SHARES;  // dQ^T's rows (head dims) of a sub-group
  constexpr int S_TILES = SLAB / M, DQ_TILES = DQ_ROWS / M, DS_STEPS = SLAB / K;
  static_assert(BLOCK_N % SLAB == 0 && SLAB % K == 0 && SLAB % MATRIX_KEY_CHUNK == 0 &&
                    DQ_ROWS % M == 0,
                "whole slabs and reduction steps, a share whole tiles");
  constexpr auto GLOBAL = sycl::access::address_space::global_space;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto sg = item.get_sub_group();
  const int item_id = static_cast<int>(item.get_local_id(0));
  const int lid = SHARES == 1 ? item_id : item_id % BLOCK_M;  // the query row's in the block
  const int share = SHARES == 1 ? 0 : item_id / BLOCK_M;
  // The sub-group's first row, by a broadcast IGC knows is uniform (lid minus the lane's index
  // is not to it): Q^T and dO^T tile pointers stay scalar rather than per-lane 64-bit values held
  // through the key loop.
  const int r0 = sycl::group_broadcast(sg, lid, 0);
  const QueryBlock block = query_block(c, static_cast<int64_t>(item.get_group(0)), BLOCK_M);
  if (block.empty) return;
  const SeqInfo& seq = block.seq;
  const int64_t q_begin = block.begin, q_end = block.end;
  const int64_t row = q_begin + lid;
  static_assert(Packed::TILED == TILED, "the pack is in the order its tiles are read");
  const typename Packed::Rows rows = Packed::rows(p, block.batch, block.head, q_begin / BLOCK_M);
  // The sub-group's columns of Q^T and dO^T (B operands), rows LDB words apart.
  const uint32_t* q_t = Packed::columns(rows.q_t, r0);
  const uint32_t* do_t = Packed::columns(rows.do_t, r0);
  constexpr int LDB = Packed::COLUMN_GROUP;

  MatrixAcc<M, R> dq[DQ_TILES];
IPEX_FLASH_TILE_LOOP
  for (int t = 0; t < DQ_TILES; ++t) matrix_fill(sg, dq[t], 0.f);
  const BlockMask mask = BlockMask::of(c.mask, seq);
  const ScoreMod score_mod = ScoreMod::of(c, seq, block.batch, block.head, p.mask_bits);
  const BwdRowStats stats = BwdRowStats::of(p, seq, block.batch, block.head, row);
  const int64_t kv_first = mask.first_key(q_begin) / BLOCK_N * BLOCK_N;
  const int64_t kv_end = mask.end_key(q_end);
  const int64_t key_block0 = Packed::first_key_block(p, block.batch, block.head_kv);

  // One K/V block, in either form of run_blocks (score/block_mask.hpp): GENERAL for the blocks
  // the mask cuts through and every block under dropout, the lean form for the others, without
  // the mask's or dropout's code (bwd_score_grads; score changes, the user's mask included, in
  // both, and the user's mask's vote on skipping the block). With score changes too: the
  // general form's dropout code was most of the loop there.
  const auto kv_block = [&](auto general, int64_t kv_begin) __attribute__((always_inline)) {
    constexpr bool GENERAL = decltype(general)::value;
    // (A fully visible block's keys are all below kv_end: its length is a constant.)
    if (score_mod.attn_mask.hides_lines<FEATURES, BLOCK_N, R>(
            sg, row < q_end, row, kv_begin, 0, 1,
            GENERAL ? static_cast<int>(std::min<int64_t>(kv_begin + BLOCK_N, kv_end) - kv_begin)
                    : BLOCK_N))
      return;
    const typename Packed::Keys keys =
        Packed::keys(p, key_block0 + kv_begin / BLOCK_N);
    const bool fully_visible =
        !GENERAL || mask.block_fully_visible(q_begin, q_end, kv_begin, kv_begin + BLOCK_N);
    // The share's rows of K^T, the block's BLOCK_N columns (the slabs' at their column).
    const Surface k_t{keys.k_t + Surface::Order::offset(share * DQ_ROWS, 0, BLOCK_N, BLOCK_N),
                      DQ_ROWS, BLOCK_N, BLOCK_N};
#pragma unroll 1
    for (int slab = 0; slab < BLOCK_N; slab += SLAB) {
      // The slab's rows of K and V (whole strips: the same start in either order), its columns
      // of K^T (tile by tile, from the slab's first tile of K^T's first strip, of BLOCK_N
      // columns).
      const Surface k_rows{keys.k + slab * HEAD_DIM, SLAB, HEAD_DIM, HEAD_DIM};
      const Surface v_rows{keys.v + slab * HEAD_DIM, SLAB, HEAD_DIM, HEAD_DIM};
      MatrixAcc<M, R> s[S_TILES], dp[S_TILES];
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < S_TILES; ++t) {
        matrix_fill(sg, s[t], 0.f);
        matrix_fill(sg, dp[t], 0.f);
      }
      if constexpr (TILED) {  // no 2-D block loads: a tile per load, B tiles one block each
        // The sub-group barrier (no instruction on the engine) keeps IGC from hoisting the
        // loop-invariant Q^T and dO^T loads out of the key loop: held beside dQ^T through it,
        // they spilled on DG2 at d = 32-64, two sub-groups per rows or not (as the forward's
        // Q^T; gpu-check's record).
        sycl::group_barrier(sg);
        matrix_mad_surface<T, M, K, R, HEAD_DIM, S_TILES, GLOBAL>(sg, s, k_rows, 0, q_t, LDB);
        matrix_mad_surface<T, M, K, R, HEAD_DIM, S_TILES, GLOBAL>(sg, dp, v_rows, 0, do_t, LDB);
      } else {
        matrix_mad_surface_wide<T, M, K, R, HEAD_DIM, S_TILES, SLAB, GLOBAL>(sg, s, k_rows, 0, q_t,
                                                                             LDB);
        matrix_mad_surface_wide<T, M, K, R, HEAD_DIM, S_TILES, SLAB, GLOBAL>(sg, dp, v_rows, 0,
                                                                             do_t, LDB);
      }

      // dS for the lane's row, a chunk of keys at a time, in the dtype.
      T ds[SLAB];
IPEX_FLASH_TILE_LOOP
      for (int c0 = 0; c0 < SLAB; c0 += CHUNK) {
        float qk[CHUNK], grad[CHUNK];
        chunk_of_columns<M>(sg, s, c0, qk);
        chunk_of_columns<M>(sg, dp, c0, grad);
        bwd_score_grads<FEATURES, GENERAL, TanhForm::FUSED, /*MASK_BITS=*/true>(
            c, score_mod, mask, fully_visible, block.batch_head, row, kv_begin + slab + c0, stats,
            qk, grad);
IPEX_FLASH_TILE_LOOP
        for (int j = 0; j < CHUNK; ++j) ds[c0 + j] = from_float<T>(grad[j]);
      }
      if constexpr (DS_STEPS == 1) {  // a lone operand: K^T's slab columns of its block
        MatrixBRegisters<T, K, R> ds_t;
        matrix_b_from_column<K>(sg, ds_t, ds);
        slab_gradient_step<T, M, K, R, DQ_TILES>(sg, dq, k_t, 0, slab, ds_t);
      } else {
        MatrixBRegisters<T, K, R> ds_t[DS_STEPS];
IPEX_FLASH_TILE_LOOP
        for (int k = 0; k < DS_STEPS; ++k) matrix_b_from_column<K>(sg, ds_t[k], &ds[k * K]);
        const Surface k_cols{k_t.base + k_t.offset(0, slab), DQ_ROWS, TILED ? BLOCK_N : SLAB,
                             BLOCK_N};
        matrix_mad_surface_wide<T, M, K, R, SLAB, DQ_TILES>(sg, dq, k_cols, 0, ds_t);
      }
    }
  };
  // The blocks in order, the fully visible ones (none under dropout) in the lean loop.
  run_key_blocks<FEATURES, /*SPLIT=*/true>(mask, c.dropout.enabled, q_begin, q_end, kv_first,
                                           kv_end, BLOCK_N, kv_block);

  float values[DQ_ROWS];
  lane_row_of_tiles<M>(sg, dq, values);
  if (row >= seq.len_q) return;
  T* out = static_cast<T*>(p.dq) + block.batch * p.dq_stride.batch +
           block.head * p.dq_stride.head + (seq.q_row0 + row) * p.dq_stride.row +
           share * DQ_ROWS;
  const int head_dims = c.dims.head_dim - share * DQ_ROWS;  // of this share
IPEX_FLASH_TILE_LOOP
  for (int d = 0; d < DQ_ROWS; ++d)
    if (d < head_dims) out[d] = from_float<T>(values[d] * c.scale);
}

}  // namespace ipex_flash
