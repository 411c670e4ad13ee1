// Key streams: the decode kernel's order of keys on the CPU device (decode/kernel.hpp), for
// caches whose key rows hold the heads side by side ((B, N, H, D), flash-attn's, and paged).
//
// The split's keys are cut into KEYS_PER_STEP runs of stream_len keys, and step t of a block
// takes the t-th key of each run. The scores, step by step over every head, then P.V, also
// step by step (each head's O read, updated with the step's keys and written back), so read
// each run in memory order, a key's rows of every head in turn.
//
// Why: the CPU's prefetchers keep reads in flight under the compute for a few such streams.
// With a step's keys side by side instead, several keys share each 4 KB page and are read in
// alternation, and the prefetchers do not follow; the kernel then waits for each read.
// Measured in scripts/bench/stream_overlap.c and on the kernel (bf16 decode 1.4x, fp32 1.2x, no
// burst of reads needed). Kernels of 8 or more rows keep the
// consecutive order (step-major P.V loads and stores O every KEYS_PER_STEP keys, too often
// with 2 or 1 keys per step), and so do (B, H, N, D) caches, whose heads are streams already.
// Dimension legend as in decode/traits.hpp.
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>
#include <cstdint>

#include "decode/scores.hpp"
#include "decode/traits.hpp"
#include "common/kernel_props.hpp"

namespace ipex_flash {

// One key's share of P.V, PASS_VECS head-dim vectors from v0: sum[u][r] += the key's
// probability for row r (p_key[r * KEYS_PER_STEP]) times V's vector v0 + u. Shared by the
// kernel's head-major P.V and the streams' step-major one.
template <class Tr, int PASS_VECS>
IPEX_FLASH_INLINE inline void decode_pv_key(sycl::sub_group sg, const typename Tr::KV* v_row,
                                            int v0, const float* p_key, const DecodeColumns& cols,
                                            int lid, float (&sum)[PASS_VECS][Tr::GROUP_ROWS]) {
#pragma unroll
  for (int u0 = 0; u0 < PASS_VECS; u0 += Tr::PER_LOAD) {
    float v_vec[Tr::PER_LOAD];
    Tr::Row::load(sg, v_row, v0 + u0, cols.whole_v, cols.head_dim_v, lid, v_vec);
#pragma unroll
    for (int u = 0; u < Tr::PER_LOAD; ++u)
#pragma unroll
      for (int r = 0; r < Tr::GROUP_ROWS; ++r)
        sum[u0 + u][r] += p_key[r * Tr::KEYS_PER_STEP] * v_vec[u];
  }
}

// P.V of step t of a block for every head of the group: O (acc) += the step's probabilities
// (probs[head][t][r * KEYS_PER_STEP + j]) times V rows of the step's keys, O first rescaled by
// the head's factor for this block at step 0. (A function the CPU compiler must inline:
// common/kernel_props.hpp.)
template <class Tr>
IPEX_FLASH_INLINE inline void decode_stream_pv(
    sycl::sub_group sg, const DecodeHeads<typename Tr::KV>& heads, const DecodeKeys& keys, int t,
    float (&acc_all)[Tr::MAX_HEADS][Tr::GROUP_ROWS][Tr::HEAD_DIM],
    const float (&probs)[Tr::PROB_HEADS][Tr::STEPS][Tr::LANES],
    const float (&row_factor)[Tr::FACTOR_HEADS][Tr::LANES], const DecodeColumns& cols,
    int lid) {
  constexpr int LANES = Tr::LANES, GROUP_ROWS = Tr::GROUP_ROWS, PV_VECS = Tr::PV_VECS;
  constexpr int KEYS_PER_STEP = Tr::KEYS_PER_STEP;
  for (int hk = 0; hk < heads.count; ++hk) {
    const KvRows<typename Tr::KV> v = heads.v(hk);
    float(&acc)[GROUP_ROWS][Tr::HEAD_DIM] = acc_all[hk];
    const float* step_probs = &probs[hk][t][0];
    for (int v0 = 0; v0 < Tr::D_VECS; v0 += PV_VECS) {
      float sum[PV_VECS][GROUP_ROWS];  // (v, r)
#pragma unroll
      for (int u = 0; u < PV_VECS; ++u)
#pragma unroll
        for (int r = 0; r < GROUP_ROWS; ++r)
          sum[u][r] = acc[r][(v0 + u) * LANES + lid] *
                      (t == 0 ? row_factor[hk][r * KEYS_PER_STEP] : 1.f);
      // Left rolled: unrolled, the CPU compiler's vector code gathered (16 keys of one row).
      for (int j = 0; j < KEYS_PER_STEP; ++j)
        decode_pv_key<Tr, PV_VECS>(sg, v.row(keys.template step_key<Tr>(t, j)), v0,
                                   step_probs + j, cols, lid, sum);
#pragma unroll
      for (int u = 0; u < PV_VECS; ++u)
#pragma unroll
        for (int r = 0; r < GROUP_ROWS; ++r) acc[r][(v0 + u) * LANES + lid] = sum[u][r];
    }
  }
}

}  // namespace ipex_flash
