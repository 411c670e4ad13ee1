// Dropout on attention probabilities from a counter-based generator (Philox 4x32-10,
// Salmon et al. 2011): the keep decision for (batch*head, row, key) is a pure function of
// the seed, the offset and those indices, so the backward pass regenerates exactly the
// forward's mask without storing it. One Philox call yields four 32-bit values, used for four
// consecutive keys of one row.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

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

// The four random words for keys [key4 * 4, key4 * 4 + 4) of `row` in `batch_head`.
inline void dropout_words(const DropoutParams& dropout, int64_t batch_head, int64_t row,
                          int64_t key4, uint32_t (&words)[4]) {
  words[0] = static_cast<uint32_t>(key4);
  words[1] = static_cast<uint32_t>(row);
  words[2] = static_cast<uint32_t>(batch_head);
  words[3] = static_cast<uint32_t>(dropout.offset) ^ static_cast<uint32_t>(key4 >> 32);
  philox4x32_10(words, static_cast<uint32_t>(dropout.seed),
                static_cast<uint32_t>(dropout.seed >> 32));
}

// factor[j] for keys key0 + j of one row (key0 a multiple of 4): 1/(1-p) if kept, else 0.
template <int N>
inline void dropout_factors_for_keys(const DropoutParams& dropout, int64_t batch_head,
                                     int64_t row, int64_t key0, float (&factor)[N]) {
  static_assert(N % 4 == 0, "one Philox call serves four keys");
#pragma unroll
  for (int j4 = 0; j4 < N; j4 += 4) {
    uint32_t words[4];
    dropout_words(dropout, batch_head, row, (key0 + j4) / 4, words);
#pragma unroll
    for (int u = 0; u < 4; ++u) factor[j4 + u] = words[u] >= dropout.threshold ? dropout.keep_scale : 0.f;
  }
}

// factor[i] for rows row0 + i and one key.
template <int N>
inline void dropout_factors_for_rows(const DropoutParams& dropout, int64_t batch_head,
                                     int64_t row0, int64_t key, float (&factor)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    uint32_t words[4];
    dropout_words(dropout, batch_head, row0 + i, key / 4, words);
    // Selected, not indexed: a private array indexed at run time lives in scratch memory on
    // GPUs.
    const uint32_t word = (key & 2) != 0 ? ((key & 1) != 0 ? words[3] : words[2])
                                         : ((key & 1) != 0 ? words[1] : words[0]);
    factor[i] = word >= dropout.threshold ? dropout.keep_scale : 0.f;
  }
}

// The same decisions as a mask for the register dK/dV kernel, whose sub-group's lanes hold
// consecutive keys from a multiple of 4 (`key`: the lane's): bit i of lane j's mask is row
// row0 + i against lane j's key. The lanes share the Philox calls: for each run of LANES rows,
// lane l draws row l's words for all the sub-group's keys (LANES / 4 calls, four keys each)
// and the bits are transposed across the lanes. A quarter of the calls of each lane drawing
// its own key row by row, and no per-lane value of the key lives through the caller's loops:
// those values spilled beside the kernel's resident dK^T at d = 128 (with softcap).
template <int ROWS, int LANES>
inline uint32_t dropout_kept_rows(sycl::sub_group sg, const DropoutParams& dropout,
                                  int64_t batch_head, int64_t row0, int64_t key) {
  static_assert(ROWS % LANES == 0 && ROWS <= 32 && LANES % 4 == 0 && LANES <= 32,
                "whole runs of rows, one bit per row, whole Philox calls per sub-group");
  const int lane = static_cast<int>(sg.get_local_id()[0]);
  const int64_t first_key4 = sycl::group_broadcast(sg, key, 0) / 4;
  // The seed through a broadcast too, which IGC does not hoist: Philox's key schedule derived
  // from it outside the caller's loops stayed live through its lean loop (run_blocks), where
  // the 8-wide engines' dK/dV issued more (DG2, Arrow Lake-H at d = 64).
  DropoutParams local = dropout;
  local.seed = sycl::group_broadcast(sg, dropout.seed, 0);
  uint32_t kept = 0;
#pragma unroll 1
  for (int run = 0; run < ROWS; run += LANES) {
    uint32_t row_keys = 0;  // bit k: row row0 + run + lane against the sub-group's key k
#pragma unroll 1
    for (int k4 = 0; k4 < LANES / 4; ++k4) {
      uint32_t words[4];
      dropout_words(local, batch_head, row0 + run + lane, first_key4 + k4, words);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        row_keys |= static_cast<uint32_t>(words[u] >= dropout.threshold) << (4 * k4 + u);
    }
#pragma unroll
    for (int i = 0; i < LANES; ++i)
      kept |= (sycl::select_from_group(sg, row_keys, i) >> lane & 1u) << (run + i);
  }
  return kept;
}

}  // namespace ipex_flash
