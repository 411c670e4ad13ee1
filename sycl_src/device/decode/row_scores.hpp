// The score changes of the decode kernel's register form (decode/xmx_kernel.hpp), whose rows
// span a GQA group's query heads and new tokens: softcap, each row's own head's ALiBi slope and
// its distance from the keys, and each row's line of the user's mask. Lane r holds row r's
// values (a form's ROWS are at most its lanes); a tile's row i reads them from lane
// rt * M + i, a broadcast from a lane known at compile time (one move from a scalar region),
// so the changes cost the loop no per-row lookups of heads or tokens.
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>
#include <cstdint>

#include "common/features.hpp"
#include "common/kernel_props.hpp"
#include "common/params.hpp"
#include "decode/rows.hpp"
#include "matrix/registers.hpp"
#include "score/block_mask.hpp"
#include "score/softcap_alibi.hpp"

namespace ipex_flash {

// ROW_SCALES: each row's scores in a unit of its own (`scale` per row, lane r's: an FP8 cache
// under bfloat16 queries, decode_stage_queries_in_half), else one for all.
template <int FEATURES, bool ROW_SCALES = false>
struct DecodeRowScores {
  static constexpr bool ALIBI = (FEATURES & FEATURE_ALIBI) != 0;
  static constexpr bool MASK = (FEATURES & FEATURE_ATTN_MASK) != 0;
  // A bool mask is read as its bits (packed by the host, decode_mask_bits): the parameters'
  // data the words, their strides whole words' bytes; a key block starts a word.
  static constexpr bool MASK_BITS = (FEATURES & FEATURE_MASK_BOOL) != 0;
  // This lane's row's: softcap (every row's) and its head's ALiBi slope and mask plane.
  ScoreMod mod;
  float scale;       // q_prescale (times an FP8 cache's K descale): dot products to exp2-domain
                     // scores (score/softcap_alibi.hpp)
  int64_t position;  // the row's token + the sequence's diagonal (ALiBi distances from it)
  int64_t mask_row;  // bytes from the mask's data to the row's line
  // The mask's data and key stride, as one plane whose rows are the offsets above.
  AttnMaskPlane mask;

  // Row `lid` of the form's ROWS (a lane past them, or past the rows there are, takes row 0's
  // values: its scores are hidden or never read); key_scale: what the dot products are in
  // units of beside q_prescale (an FP8 cache's K descale and unit, 1 otherwise).
  static inline DecodeRowScores of(const AttentionCommon& c, const DecodeRows& rows, int h_kv,
                                   int rows_held, int lid, float key_scale) {
    const int r = lid < rows_held && lid < rows.count ? lid : 0;
    const int h = rows.query_head(h_kv, r);
    const ScoreMod mod = ScoreMod::of(c, rows.seq, rows.b, h);
    const int64_t token = rows.token(r);
    const AttnMaskParams& m = c.score_mod.attn_mask;
    return DecodeRowScores{mod, c.q_prescale * key_scale, token + rows.seq.diag,
                           MASK ? rows.b * m.batch + h * m.head + token * m.row : 0,
                           AttnMaskPlane{static_cast<const uint8_t*>(m.data), 0, m.col,
                                         rows.seq.len_q, rows.seq.len_k}};
  }

  // What a key block's scores take from the rows: each lane's row's distance from the block's
  // first key (a float: the elements step from it in float, exact below 2^24), and the byte
  // offset of its mask element there (the elements add their key's offset, a 64-bit multiply
  // a tile).
  struct Block {
    float distance0;
    int64_t mask0;
  };
  inline Block at(int64_t kv_begin) const {
    return Block{ALIBI ? static_cast<float>(position - kv_begin) : 0.f,
                 MASK_BITS ? mask_row + (kv_begin >> 5) * 4
                 : MASK    ? mask_row + kv_begin * mask.col_stride
                           : 0};
  }

  // Row tile rt's dot products with this lane's key `key` in its column of s, made scores; with
  // GENERAL masked too: rows past the rows there are, keys at or past kv_end (a key past the
  // last reads the last's mask element) and keys the block mask hides. always_inline, not
  // IPEX_FLASH_INLINE: left to IGC, the call made BMG's d = 128 decode with every score change
  // spill 3328 bytes and take 8576 of private memory.
  template <bool GENERAL, int M, class Acc>
  __attribute__((always_inline)) void apply_tile(sycl::sub_group sg, Acc& s, const Block& block,
                                                 int rt, int64_t key, int64_t kv_begin,
                                                 int64_t kv_end, const DecodeRows& rows,
                                                 const BlockMask& mask) const {
    float column[M];  // rows of this lane's key
    matrix_acc_column(sg, s, column);
    const int key_in_block =
        static_cast<int>((GENERAL ? std::min(key, kv_end - 1) : key) - kv_begin);
    apply<M>(sg, column, block, rt, key_in_block);
    if constexpr (GENERAL) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const int r = rt * M + i;
        if (r >= rows.count || key >= kv_end || !mask.visible(rows.token(r), key))
          column[i] = NEG_INF;
      }
    }
    matrix_acc_set_column(sg, s, column);
  }

  // column[i]: the dot product of row rt * M + i with this lane's key, key_in_block keys from
  // the block's first (a key past the split's last: pass the last's, whose mask element exists;
  // the caller hides the score), made the score.
  template <int M>
  IPEX_FLASH_INLINE void apply(sycl::sub_group sg, float (&column)[M], const Block& block,
                               int rt, int key_in_block) const {
#pragma unroll
    for (int i = 0; i < M; ++i)
      column[i] *= ROW_SCALES ? sycl::group_broadcast(sg, scale, rt * M + i) : scale;
    if constexpr ((FEATURES & FEATURE_SOFTCAP) != 0) {
      // The short tanh (tanh_complement) beside ALiBi and a mask too: its spills were the
      // forward's and the 8-wide backward's (softcap_beside_score_changes); this kernel does
      // not spill with it (gpu-check), and a decode has no backward to agree with.
      float unused_grad[M];
      mod.template apply_from<FEATURE_SOFTCAP>(column, unused_grad, 0.f, 0.f);
    }
    if constexpr (ALIBI) {
      const float key = static_cast<float>(key_in_block);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const float slope = sycl::group_broadcast(sg, mod.alibi_log2, rt * M + i);
        const float distance0 = sycl::group_broadcast(sg, block.distance0, rt * M + i);
        column[i] -= slope * sycl::fabs(distance0 - key);
      }
    }
    if constexpr (MASK_BITS) {
      // The tile's keys share a word (tiles of 16 keys from a word's start): each row's is one
      // load from a uniform address, each lane testing its key's bit.
      const int word = sycl::group_broadcast(sg, key_in_block, 0) >> 5;
      const uint32_t key_bit = 1u << (key_in_block & 31);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const int64_t row_offset = sycl::group_broadcast(sg, block.mask0, rt * M + i);
        const uint32_t bits = *reinterpret_cast<const uint32_t*>(mask.base + row_offset + 4 * word);
        if ((bits & key_bit) == 0) column[i] = NEG_INF;
      }
    } else if constexpr (MASK) {
      const int64_t key_offset = static_cast<int64_t>(key_in_block) * mask.col_stride;
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const int64_t row_offset = sycl::group_broadcast(sg, block.mask0, rt * M + i);
        column[i] += mask.template addend<FEATURES>(row_offset + key_offset);
      }
    }
  }
};

}  // namespace ipex_flash
