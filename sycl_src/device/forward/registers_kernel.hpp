// FlashAttention-2 forward on the matrix engine with its tiles in registers, the shape XMX
// kernels want on Intel GPUs: the same blocks, mask, score modifiers, dropout and online
// softmax as forward/matrix_kernel.hpp (whose SLM-staged form serves AMX, and the 8-wide engines
// with score changes), without the SLM round trips. For the 256-register GPUs (PVC, BMG, Lunar
// Lake; sub-group 16) and the 8-wide engines of Arc A-series and Arrow Lake-H (128 registers;
// sub-group 8, 16-key blocks, two sub-groups per query rows past head dim 64: VALUE_SPLIT) up
// to head dim 128, and their emulations.
// Dimension legend as in forward/vector_kernel.hpp (q, kv, d), plus r: the MATRIX_N query rows
// of one sub-group, one per lane.
//
// One work-group per (batch, query head, Q block), BLOCK_M / MATRIX_N sub-groups of MATRIX_N
// lanes; lane r of a sub-group owns query row r. Everything is computed transposed so that a
// row's values are its lane's column of each tile (matrix/registers.hpp). Per K/V block:
//   S^T (kv, r) = K (kv, d) . Q^T (d, r)     BLOCK_N / MATRIX_M accumulators, in registers
//   softmax over kv                          each lane on its own column: no exchange
//   P^T (kv, r)                              B operands built in registers from the column
//   O^T (dv, r) = rescale * O^T + V^T . P^T  DV / MATRIX_M accumulators (DV below), resident
//                                            for the whole K/V loop
// HEAD_DIM is Q's and K's compiled head dim, HEAD_DIM_V V's and O's: the host compiles them
// apart where they differ (MLA prefill: 192 and 128), so that P.V and the O^T accumulators run
// at V's head dim rather than the larger one; equal otherwise.
// K and V^T are read as A tiles from the packed copy (forward/pack_kv.hpp), in 2-D blocks of
// many tiles (matrix/block_io.hpp), or on the 8-wide engines one contiguous tile at a time. Q^T
// is staged once in SLM in the matrix engine's packed B layout and read as whole B tiles (once,
// up to d = 64; per block above and on the 8-wide engines), the only SLM the kernel uses; each
// sub-group reads only its own columns, so there is no work-group barrier.
// P is rounded to the input dtype before its product, as in FlashAttention-2 on GPUs.
#pragma once

#include <sycl/sycl.hpp>

#include <limits>

#include "score/dropout.hpp"
#include "forward/block_edges.hpp"
#include "forward/pack_kv.hpp"
#include "forward/register_output.hpp"
#include "forward/register_scores.hpp"
#include "common/kernel_props.hpp"
#include "common/kv_quant.hpp"
#include "score/block_mask.hpp"
#include "matrix/block_io.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "common/powers_of_two.hpp"
#include "forward/params.hpp"
#include "score/softcap_alibi.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// VALUE_SPLIT sub-groups share each MATRIX_N query rows, each computing their scores and
// softmax alike (the same arithmetic: the same results) and its own HEAD_DIM_V / VALUE_SPLIT
// of O^T: the 8-wide engines at head dim 128, whose 128 registers a whole O^T would fill. The
// work-group is BLOCK_M x VALUE_SPLIT work-items.
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N, int HEAD_DIM_V, int VALUE_SPLIT>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<MATRIX_N>))
IPEX_FLASH_REGISTER_FILE
void flash_fwd_matrix_registers_kernel(FwdParams p) {
  constexpr int M = MATRIX_M, K = MATRIX_K, R = MATRIX_N;
  constexpr int DV = HEAD_DIM_V / VALUE_SPLIT;  // O^T's rows (V's head dims) of a sub-group
  constexpr int S_TILES = BLOCK_N / M, O_TILES = DV / M, P_STEPS = BLOCK_N / K;
  // The register budget below is sized by the wider of the two head dims: O^T's accumulators
  // grow with DV, and at HEAD_DIM above 64 Q^T is read from SLM per block, costing no
  // registers that stay.
  constexpr int WIDEST = HEAD_DIM > DV ? HEAD_DIM : DV;
  // K and V^T are read in 2-D blocks of A_ROWS x 32 (matrix/block_io.hpp): 16 rows at d = 128,
  // where 32-row blocks spilled beside the 128 registers of O^T. With every score change too,
  // since their code is a few instructions a score (fused tanh, the mask's bits): read tile by
  // tile, ALiBi and a mask issued 1.5x the instructions per DPAS on BMG at d = 128
  // (docs/gpu_loop_costs.md).
  constexpr int A_ROWS = WIDEST > 64 ? 16 : 32;
  // The 8-wide engines (DG2, Arrow Lake-H) read K and V^T tile by tile from their own order of
  // the pack (matrix/surface.hpp): they have no 2-D block loads.
  // There the pack's blocks start at multiples of their size where it is a power of two (the
  // host aligns the pack: forward_launch.cpp); with D = Dv and V^T's shares powers of two too,
  // K and each share of V^T start at a multiple of their own, and a tile's address is their
  // start OR its offset (OR_OFFSETS): one instruction where a 64-bit add took about five.
  using Packed = PackedKv<T, HEAD_DIM, BLOCK_N, HEAD_DIM_V>;
  constexpr bool TILED = PackedSurface<T, M, K, R>::Order::TILED;
  constexpr bool OR_OFFSETS =
      fwd_pack_alignment(HEAD_DIM, HEAD_DIM_V, BLOCK_N, R, /*registers=*/true) > 1 &&
      HEAD_DIM == HEAD_DIM_V && power_of_two(DV);
  using Surface = PackedSurface<T, M, K, R, OR_OFFSETS>;
  // A float mask past d = 64 is read in place beside O^T's 128 registers: split into lean and
  // edge loops, or in 2-D blocks, the kernel spilled 4-9 KB (BMG, PVC; gpu-check), so there it
  // keeps one loop over blocks read tile by tile, as before the split.
  constexpr bool FLOAT_MASK_WIDE = wide_float_mask(WIDEST, FEATURES);
  constexpr bool WIDE = !TILED && !FLOAT_MASK_WIDE;
  // Softcap's tanh is the fused form (score/softcap_alibi.hpp): its input's 2 log2(e) rides
  // in the scale's multiply. Beside a float mask past d = 64 (one loop) the library's, as
  // before: the fused one spilled there beside ALiBi (BMG).
  constexpr TanhForm TANH = FLOAT_MASK_WIDE ? default_tanh(FEATURES) : TanhForm::FUSED;
  static_assert(BLOCK_M % R == 0 && BLOCK_N % M == 0 && BLOCK_N % K == 0 &&
                    BLOCK_N % MATRIX_KEY_CHUNK == 0 && HEAD_DIM % K == 0 && HEAD_DIM % M == 0 &&
                    HEAD_DIM_V % (M * VALUE_SPLIT) == 0 && (VALUE_SPLIT == 1 || TILED),
                "tile shape");
  // Q^T (d/2, q) packed, a copy per share of V's head dims. Each sub-group's columns together
  // (Q_GROUPED, a B tile's rows contiguous) on the 8-wide engines, which read a B tile as one
  // block, and past d = 64, where Q^T is read per block: IGC reads such a tile in 4-register
  // SLM loads, not a load a row (16 sends a block, not 64, at d = 128): 1.3-1.9 instructions
  // per DPAS fewer on BMG and PVC (gpu-check).
  static syclexp::work_group_static<uint32_t[VALUE_SPLIT * HEAD_DIM / 2 * BLOCK_M]> q_slm;
  constexpr bool Q_GROUPED = TILED || WIDEST > 64;
  constexpr int Q_GROUP = Q_GROUPED ? R : BLOCK_M;  // load_tile_packed's grouping of the columns

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto sg = item.get_sub_group();
  const int item_id = static_cast<int>(item.get_local_id(0));
  // The work-item's query row in the block, and its share of V's head dims (uniform per
  // sub-group); constants without a split (the work-group is BLOCK_M then, which the compiler
  // cannot know).
  const int lid = VALUE_SPLIT == 1 ? item_id : item_id % BLOCK_M;
  const int share = VALUE_SPLIT == 1 ? 0 : item_id / BLOCK_M;
  uint32_t* q_words = static_cast<uint32_t*>(q_slm) + share * (HEAD_DIM / 2 * BLOCK_M);
  const int r0 = lid - static_cast<int>(sg.get_local_id()[0]);  // sub-group's first row
  constexpr int SUB_GROUPS = BLOCK_M / MATRIX_N;  // of one share (prefetches: VALUE_SPLIT 1)
  const int sub_group = r0 / MATRIX_N;
  const QueryBlock block = query_block(c, static_cast<int64_t>(item.get_group(0)), BLOCK_M);
  if (block.empty) return;
  const SeqInfo& seq = block.seq;
  const int64_t q_begin = block.begin, q_end = block.end;
  const int64_t row = q_begin + lid;
  const KvDescale descale = kv_descale<FEATURES>(c, block.batch, block.head_kv);
  const float scale = c.q_prescale * descale.k * tanh_input_scale(FEATURES, TANH);
  // Without the score changes that read the scaled score (softcap, ALiBi, a float mask), the
  // scale rides in the exponent's multiply-add: the max over the raw dot products, scaled once,
  // and p = exp2(fma(dot, scale, -max)), an instruction a score fewer. Monotone for a positive
  // scale, so the max is the scaled scores' own. A negative scale turns positive with Q loaded
  // negated (exact); a zero one becomes the smallest normal float, which leaves a finite score's
  // exponent 0, as zero does, and a hidden one -inf. Up to d = 64: past it the kernel spilled
  // 1.4-1.5 KB in its edge loops (BMG, PVC; gpu-check).
  constexpr bool SCALE_IN_EXP =
      WIDEST <= 64 && (FEATURES & (FEATURE_SOFTCAP | FEATURE_ALIBI | FEATURE_FLOAT_MASK)) == 0;
  const float score_scale =
      SCALE_IN_EXP ? sycl::fmax(sycl::fabs(scale), std::numeric_limits<float>::min()) : scale;
  const uint32_t q_flip = SCALE_IN_EXP && scale < 0.f ? 0x80008000u : 0u;
  // ALiBi's distance per element leaves the lean loop: its blocks are those left of every
  // row's diagonal (all of the fully visible ones under a causal mask), where ALiBi is a
  // shift per row and a term per key (ScoreMod::apply_left_of_diagonal); 1.4x the plain
  // loop's instructions per DPAS at d = 64 with the distance taken per element (BMG, PVC).
  constexpr bool ALIBI_LEFT = (FEATURES & FEATURE_ALIBI) != 0 && !FLOAT_MASK_WIDE;
  // How far (log2 units) a lean block's max may pass the row's before O^T is rescaled to it
  // (OnlineSoftmaxRow::raise_max_past): FlashAttention-4's 8, a factor of 256. The general
  // blocks raise it at any rise: dropout runs there, and its 1 / (1 - p) beside a P of up to
  // 256 passed float16's range from p = 0.996.
  constexpr float RESCALE_THRESHOLD = 8.f;

  // Work-item lid writes column lid of Q^T: its sub-group reads nothing else.
  load_tile_packed<BLOCK_M, HEAD_DIM, Q_GROUP>(q_words, forward_operands<T>(p, block).q,
                                               p.q_stride.row, static_cast<int>(q_end - q_begin),
                                               c.dims.head_dim, lid, BLOCK_M, q_flip);
  sycl::group_barrier(sg);
  const uint32_t* q_t = q_words + (Q_GROUPED ? sub_group * (HEAD_DIM / 2 * R) : r0);  // (d/2, r)

  // Q^T's B operands: in registers for the whole K/V loop up to d = 64 (32 registers); read
  // from SLM per block above (64 more registers would spill beside O^T's 128 at d = 128), and
  // on the 8-wide engines, whose 128 registers of 32 bytes hold O^T's 64 at d = 64.
  constexpr bool Q_IN_REGISTERS = !TILED && WIDEST <= 64 && HEAD_DIM / K >= 2;
  MatrixBRegisters<T, K, R> q_b[Q_IN_REGISTERS ? HEAD_DIM / K : 2];
  if constexpr (Q_IN_REGISTERS) {
IPEX_FLASH_TILE_LOOP
    for (int k = 0; k < HEAD_DIM / K; ++k)
      matrix_b_load_packed<T>(sg, q_b[k], q_t + k * K / 2 * Q_GROUP, Q_GROUP);
  }

  MatrixAcc<M, R> o[O_TILES];
IPEX_FLASH_TILE_LOOP
  for (int t = 0; t < O_TILES; ++t) matrix_fill(sg, o[t], 0.f);

  const BlockMask mask = BlockMask::of(c.mask, seq);
  // A bool mask is read as its bits (score/mask_bits_kernel.hpp, packed by the host).
  constexpr bool MASK_BITS = (FEATURES & FEATURE_MASK_BOOL) != 0;
  const ScoreMod score_mod = MASK_BITS
                                 ? ScoreMod::of(c, seq, block.batch, block.head, p.mask_bits)
                                 : ScoreMod::of(c, seq, block.batch, block.head);
  const int64_t kv_first = mask.first_key(q_begin) / BLOCK_N * BLOCK_N;
  const int64_t kv_end = mask.end_key(q_end);
  OnlineSoftmaxRow softmax = ScoreMod::start_row(c, block.head);

  const T* k_tile = Packed::block(p, block.batch, block.head_kv, kv_first / BLOCK_N);
  // A block's K and V^T (the share's rows: whole tile rows in either order); up to d = 64 with
  // 2-D block descriptors built once and moved block to block (matrix/block_io.hpp): past it
  // their two registers spilled beside O^T (BMG, PVC).
  constexpr bool BLOCKS = WIDE && WIDEST <= 64;
  const int v_at = BLOCK_N * HEAD_DIM + share * DV * BLOCK_N;
  auto keys = SurfaceBlocks<Surface, A_ROWS, BLOCKS>::of({k_tile, BLOCK_N, HEAD_DIM, HEAD_DIM});
  auto values = SurfaceBlocks<Surface, A_ROWS, BLOCKS>::of({k_tile + v_at, DV, BLOCK_N, BLOCK_N});

  // One K/V block, in either form of run_blocks (score/block_mask.hpp): GENERAL for the blocks
  // the mask cuts through (the diagonal, a window's edges, the keys' last partial block) and
  // every block under dropout; the lean form for the others, without the mask's or dropout's
  // code. Both do the same operations in the same order on a fully visible block, score
  // changes included.
  const auto kv_block = [&](auto general, int64_t kv_begin) __attribute__((always_inline)) {
    constexpr bool GENERAL = decltype(general)::value;
    keys.rebase(k_tile);
    values.rebase(k_tile + v_at);
    const bool fully_visible =
        !GENERAL || mask.block_fully_visible(q_begin, q_end, kv_begin, kv_begin + BLOCK_N);

    // The next block's K and V^T, shared by the sub-groups, asked for while this one computes.
    // Up to d = 64: at 128 the addresses spilled beside the resident accumulators on PVC.
    if constexpr (WIDEST <= 64 && !TILED) {
      if (kv_begin + BLOCK_N < kv_end)
        matrix_prefetch_run<Packed::BLOCK_ELEMENTS, SUB_GROUPS>(
            sg, k_tile + Packed::BLOCK_ELEMENTS, sub_group);
    }

    // S^T: every key tile against one Q^T B tile per reduction step. The sub-group barrier
    // (no instruction on the engine) keeps IGC from hoisting the loop-invariant Q^T loads out
    // of the loop: held through it beside O^T they spilled on DG2 (gpu-check's record).
    if constexpr (!Q_IN_REGISTERS) sycl::group_barrier(sg);
    MatrixAcc<M, R> s[S_TILES];
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < S_TILES; ++t) matrix_fill(sg, s[t], 0.f);
    if constexpr (Q_IN_REGISTERS)
      matrix_mad_surface_wide<T, M, K, R, HEAD_DIM, S_TILES, A_ROWS>(sg, s, keys, q_b);
    else if constexpr (WIDE)
      matrix_mad_surface_wide<T, M, K, R, HEAD_DIM, S_TILES, A_ROWS>(sg, s, keys, q_t, Q_GROUP);
    else
      matrix_mad_surface<T, M, K, R, HEAD_DIM, S_TILES>(sg, s, keys.surface, 0, q_t, Q_GROUP);

    // The row's scores (scale, modifiers, mask), a chunk of keys at a time, written back into
    // the accumulators in the block's form (forward/register_scores.hpp), and their max.
    constexpr ScoreForm FORM = score_form<FEATURES, SCALE_IN_EXP, ALIBI_LEFT, GENERAL>();
    BlockScores<FORM> scored{score_scale, score_mod.softcap_log2,
                             FORM == ScoreForm::SHIFTED ? score_mod.alibi_row_shift(row, kv_begin)
                                                        : 0.f};
IPEX_FLASH_TILE_LOOP
    for (int c0 = 0; c0 < BLOCK_N; c0 += MATRIX_KEY_CHUNK) {
      float scores[MATRIX_KEY_CHUNK];
      chunk_of_columns<M>(sg, s, c0, scores);
      score_chunk<FEATURES, TANH, MASK_BITS, FORM>(score_mod, scores, score_scale, row,
                                                   kv_begin + c0, c0);
      if constexpr (GENERAL) {
        if (!fully_visible) mask.apply_to_keys(scores, row, kv_begin + c0);
      }
IPEX_FLASH_TILE_LOOP
      for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) scored.fold(scores[j]);
      set_chunk_of_columns<M>(sg, s, c0, scores);
    }

    // Probabilities against the row's max, row sum, dropout; P in the dtype. The max rises
    // lazily (RESCALE_THRESHOLD): a block whose scores pass it by less leaves O^T as it is.
    const float rescale =
        softmax.raise_max_past(scored.max_score(), GENERAL ? 0.f : RESCALE_THRESHOLD);
    const float exp_base = OnlineSoftmaxRow::exp_base(softmax.row_max);
    float block_sum = 0.f;
    T probs[BLOCK_N];
IPEX_FLASH_TILE_LOOP
    for (int c0 = 0; c0 < BLOCK_N; c0 += MATRIX_KEY_CHUNK) {
      float chunk[MATRIX_KEY_CHUNK];
      chunk_of_columns<M>(sg, s, c0, chunk);
IPEX_FLASH_TILE_LOOP
      for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) {
        chunk[j] = scored.probability(chunk[j], exp_base);
        block_sum += chunk[j];
      }
      // After the row sum: dropout rescales P, not the softmax.
      if constexpr (GENERAL) {
        if (c.dropout.enabled) {
          float factor[MATRIX_KEY_CHUNK];
          dropout_factors_for_keys<FEATURES>(dropout_draw<FEATURES>(c, block.batch_head),
              row, kv_begin + c0, factor);
IPEX_FLASH_TILE_LOOP
          for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) chunk[j] *= factor[j];
        }
      }
IPEX_FLASH_TILE_LOOP
      for (int j = 0; j < MATRIX_KEY_CHUNK; ++j) probs[c0 + j] = from_float<T>(chunk[j]);
    }
    softmax.row_sum += block_sum;

    // O^T = rescale * O^T + V^T . P^T, the rescale only where some row's max rose past the
    // threshold, seldom past a row's first blocks (its very first has nothing to rescale,
    // unless a sink set its max). Skipped, a block issues one instruction
    // per DPAS fewer on BMG and PVC (O^T's multiplies), 4.7 on the 8-wide engines, whose
    // multiplies, were they run every block, spilled there (gpu-check's `loop_rescale`).
    if (sycl::any_of_group(sg, rescale != 1.f)) {
IPEX_FLASH_TILE_LOOP
      for (int t = 0; t < O_TILES; ++t) matrix_acc_scale_column(sg, o[t], rescale);
    }
    if constexpr (P_STEPS == 1) {  // 16-key blocks (the 8-wide engines): a lone operand
      MatrixBRegisters<T, K, R> p_t;
      matrix_b_from_column<K>(sg, p_t, probs);
      matrix_mad_surface_step<T, M, K, R, O_TILES>(sg, o, values.surface, 0, p_t);
    } else {
      MatrixBRegisters<T, K, R> p_t[P_STEPS];
IPEX_FLASH_TILE_LOOP
      for (int k = 0; k < P_STEPS; ++k) matrix_b_from_column<K>(sg, p_t[k], &probs[k * K]);
      if constexpr (WIDE)
        matrix_mad_surface_wide<T, M, K, R, BLOCK_N, O_TILES, A_ROWS>(sg, o, values, p_t);
      else
        matrix_mad_surface<T, M, K, R, BLOCK_N, O_TILES>(sg, o, values.surface, 0, p_t);
    }
    k_tile += Packed::BLOCK_ELEMENTS;
  };
  // The blocks in order, the fully visible ones (none under dropout) in the lean loop; with
  // ALiBi those of them left of the diagonal.
  run_key_blocks<FEATURES, /*SPLIT=*/!FLOAT_MASK_WIDE>(
      ALIBI_LEFT ? mask.left_of_diagonal() : mask, c.dropout.enabled, q_begin, q_end, kv_first,
      kv_end, BLOCK_N, kv_block);

  write_output_from_tiles<T, M>(p, block, lid, share * DV, sg, o, softmax, descale.v);
}

}  // namespace ipex_flash
