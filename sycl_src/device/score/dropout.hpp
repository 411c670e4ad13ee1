// Dropout on attention probabilities from a counter-based generator (Philox 4x32-10,
// Salmon et al. 2011): the keep decision for (batch*head, row, key) is a pure function of
// the seed, the offset and those indices (global ones for a block of a larger attention), so
// the backward pass regenerates exactly the forward's mask without storing it. One Philox call
// yields four 32-bit values, used for four consecutive (global) keys of one row.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "common/features.hpp"
#include "common/params.hpp"

namespace ipex_flash {

inline void philox4x32_10(uint32_t (&counter)[4], uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(kMul0) * counter[0];
    const uint64_t product1 = static_cast<uint64_t>(kMul1) * counter[2];
    const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32), lo0 = static_cast<uint32_t>(product0);
    const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32), lo1 = static_cast<uint32_t>(product1);
    counter[0] = hi1 ^ counter[1] ^ key0;
    counter[1] = lo1;
    counter[2] = hi0 ^ counter[3] ^ key1;
    counter[3] = lo0;
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
}

// One (batch, head)'s draw: the counter's (batch, head) word and where the call's row 0 and
// key 0 sit globally (GlobalPositions), so that a block of a larger attention draws the very
// decisions one call over the whole of it draws.
struct DropoutDraw {
  DropoutParams params;
  int64_t batch_head;  // global: sequence * heads + head
  int64_t row_shift;   // global position of the call's row 0 (0 for a whole call)
  int64_t key_shift;   // ... of its key 0
};

template <int FEATURES>
inline DropoutDraw dropout_draw(const AttentionCommon& c, int64_t batch_head) {
  DropoutDraw draw{c.dropout, batch_head, 0, 0};
  if constexpr ((FEATURES & FEATURE_PLACED) != 0) {  // a block of a larger attention
    const GlobalPositions& where = c.positions;
    // 32-bit: a 64-bit division is a call into an emulation routine, whose stack took 512
    // bytes of private memory on BMG and PVC. B * Hq is far below 2^32.
    const uint32_t bh = static_cast<uint32_t>(batch_head);
    const uint32_t heads = static_cast<uint32_t>(c.dims.heads_q);
    const uint32_t b = bh / heads, h = bh - b * heads;
    const int64_t* entry = where.entry(b);
    const int64_t heads_total = where.table[2] > 0 ? where.table[2] : c.dims.heads_q;
    draw.batch_head = (b + entry[0]) * heads_total + where.table[1] + h;
    draw.row_shift = entry[1];
    draw.key_shift = entry[2];
  }
  return draw;
}

// The four random words for global keys [key4 * 4, key4 * 4 + 4) of global `row`.
inline void dropout_words(const DropoutDraw& draw, int64_t row, int64_t key4,
                          uint32_t (&words)[4]) {
  words[0] = static_cast<uint32_t>(key4);
  words[1] = static_cast<uint32_t>(row);
  words[2] = static_cast<uint32_t>(draw.batch_head);
  words[3] = static_cast<uint32_t>(draw.params.offset) ^ static_cast<uint32_t>(key4 >> 32);
  philox4x32_10(words, static_cast<uint32_t>(draw.params.seed),
                static_cast<uint32_t>(draw.params.seed >> 32));
}

// Bit u: whether word u of a Philox call keeps its probability.
inline uint32_t dropout_kept_bits(const DropoutParams& dropout, const uint32_t (&words)[4]) {
  uint32_t bits = 0;
#pragma unroll
  for (int u = 0; u < 4; ++u) bits |= static_cast<uint32_t>(words[u] >= dropout.threshold) << u;
  return bits;
}

// Bit j: whether global key first + j of global_row is kept, for N <= 32 keys. The words come
// four keys at a time from the group holding `first`; keys whose global positions do not start
// a group (a block of a ring) take one more Philox call and shift the bits down. One path
// either way: a second, unrolled path for the shifted keys doubled the code.
template <int N>
inline uint32_t dropout_kept_keys(const DropoutDraw& draw, int64_t global_row, int64_t first) {
  static_assert(N % 4 == 0 && N <= 32, "whole Philox calls, one bit per key");
  const int misalign = static_cast<int>(first & 3);
  uint32_t kept = 0;
#pragma unroll
  for (int g = 0; g < N / 4; ++g) {
    uint32_t words[4];
    dropout_words(draw, global_row, first / 4 + g, words);
    kept |= dropout_kept_bits(draw.params, words) << (4 * g);
  }
  if (misalign != 0) {
    uint32_t words[4];
    dropout_words(draw, global_row, first / 4 + N / 4, words);
    kept = kept >> misalign | dropout_kept_bits(draw.params, words) << (N - misalign);
  }
  return kept;
}

// factor[j] for keys key0 + j of one row (key0 a multiple of 4): 1/(1-p) if kept, else 0.
// A whole call's keys start a group: each factor straight from its word (the kernels' code
// as it was before blocks were placed; the bits' form spilled 1344 bytes in DG2's SLM-staged
// dK/dV with every score change).
template <int FEATURES, int N>
inline void dropout_factors_for_keys(const DropoutDraw& draw, int64_t row, int64_t key0,
                                     float (&factor)[N]) {
  if constexpr ((FEATURES & FEATURE_PLACED) != 0) {
    const uint32_t kept =
        dropout_kept_keys<N>(draw, row + draw.row_shift, key0 + draw.key_shift);
#pragma unroll
    for (int j = 0; j < N; ++j) factor[j] = (kept >> j & 1u) != 0 ? draw.params.keep_scale : 0.f;
  } else {
    static_assert(N % 4 == 0, "one Philox call serves four keys");
#pragma unroll
    for (int j4 = 0; j4 < N; j4 += 4) {
      uint32_t words[4];
      dropout_words(draw, row, (key0 + j4) / 4, words);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        factor[j4 + u] = words[u] >= draw.params.threshold ? draw.params.keep_scale : 0.f;
    }
  }
}

// factor[i] for rows row0 + i and one key.
template <int N>
inline void dropout_factors_for_rows(const DropoutDraw& draw, int64_t row0, int64_t key,
                                     float (&factor)[N]) {
  const int64_t global_key = key + draw.key_shift;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    uint32_t words[4];
    dropout_words(draw, row0 + i + draw.row_shift, global_key / 4, words);
    // Selected, not indexed: a private array indexed at run time lives in scratch memory on
    // GPUs.
    const int u = static_cast<int>(global_key & 3);
    const uint32_t word = (u & 2) != 0 ? ((u & 1) != 0 ? words[3] : words[2])
                                       : ((u & 1) != 0 ? words[1] : words[0]);
    factor[i] = word >= draw.params.threshold ? draw.params.keep_scale : 0.f;
  }
}

// The same decisions as a mask for the register dK/dV kernel, whose sub-group's lanes hold
// consecutive keys from a multiple of 4 (`key`: the lane's): bit i of lane j's mask is row
// row0 + i against lane j's key. The lanes share the Philox calls: for each run of LANES rows,
// lane l draws row l's words for all the sub-group's keys (LANES / 4 calls, four keys each,
// one more when the keys' global positions do not start a word group) and the bits are
// transposed across the lanes. A quarter of the calls of each lane drawing its own key row by
// row, and no per-lane value of the key lives through the caller's loops: those values spilled
// beside the kernel's resident dK^T at d = 128 (with softcap).
template <int ROWS, int LANES, int FEATURES>
inline uint32_t dropout_kept_rows(sycl::sub_group sg, const DropoutDraw& draw, int64_t row0,
                                  int64_t key) {
  static_assert(ROWS % LANES == 0 && ROWS <= 32 && LANES % 4 == 0 && LANES <= 32,
                "whole runs of rows, one bit per row, whole Philox calls per sub-group");
  const int lane = static_cast<int>(sg.get_local_id()[0]);
  const int64_t first_key = sycl::group_broadcast(sg, key, 0) + draw.key_shift;
  const int misalign = static_cast<int>(first_key & 3);
  // The seed through a broadcast too, which IGC does not hoist: Philox's key schedule derived
  // from it outside the caller's loops stayed live through its lean loop (run_blocks), where
  // the 8-wide engines' dK/dV issued more (DG2, Arrow Lake-H at d = 64).
  DropoutDraw local = draw;
  local.params.seed = sycl::group_broadcast(sg, draw.params.seed, 0);
  uint32_t kept = 0;
#pragma unroll 1
  for (int run = 0; run < ROWS; run += LANES) {
    const int64_t row = row0 + run + lane + draw.row_shift;
    uint32_t row_keys = 0;  // bit k: row row0 + run + lane against the sub-group's key k
#pragma unroll 1
    for (int k4 = 0; k4 < LANES / 4; ++k4) {
      uint32_t words[4];
      dropout_words(local, row, first_key / 4 + k4, words);
      row_keys |= dropout_kept_bits(draw.params, words) << (4 * k4);
    }
    if ((FEATURES & FEATURE_PLACED) != 0 && misalign != 0) {  // the group past the last
      uint32_t words[4];
      dropout_words(local, row, first_key / 4 + LANES / 4, words);
      row_keys = row_keys >> misalign |
                 dropout_kept_bits(draw.params, words) << (LANES - misalign);
    }
#pragma unroll
    for (int i = 0; i < LANES; ++i)
      kept |= (sycl::select_from_group(sg, row_keys, i) >> lane & 1u) << (run + i);
  }
  return kept;
}

}  // namespace ipex_flash
