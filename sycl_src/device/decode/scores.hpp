// The decode kernel's reads ahead of its products (decode/kernel.hpp), and its scores of a key
// block on the matrix engine, before any scale, score change or mask. (The vector units'
// scores stay in the kernel.) Dimension legend as in decode/traits.hpp.
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>
#include <cstdint>

#include "common/kernel_props.hpp"
#include "decode/traits.hpp"
#include "matrix/slm_tile.hpp"
#include "common/params.hpp"
#include "decode/params.hpp"
#include "score/softcap_alibi.hpp"
#include "common/seq_info.hpp"
#include "common/sub_group_math.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

// The K/V heads a work-group serves: `count` consecutive heads from `first`, of sequence `b`.
template <typename KV>
struct DecodeHeads {
  const DecodeParams& p;
  const SeqInfo& seq;
  int b;
  int first;
  int count;

  KvRows<KV> k(int hk) const {
    return kv_rows<KV>(p.k, p.k_stride, p.common, seq, b, first + hk);
  }
  KvRows<KV> v(int hk) const {
    return kv_rows<KV>(p.v, p.v_stride, p.common, seq, b, first + hk);
  }
};

// What a head's score steps share, made once per head where the order allows (on GPUs making
// it per step cost registers).
template <typename KV>
struct DecodeHeadRows {
  KvRows<KV> k, v;
  float k_scale;
  ScoreMod score_mod;
};

// Keys a page lookup serves: a run of DECODE_KEY_RUN keys from a multiple of it never crosses
// a page (page sizes are multiples of it, or one page holds the sequence: make_common's check),
// and key blocks start at multiples of it, so a run's rows are evenly spaced from its first.
constexpr int DECODE_KEY_RUN = 16;

// The K (or V) rows of step t's keys: one page lookup for the step (a run's part), the rest
// evenly spaced, a key past the split's last reading the last key's row (the mask drops it);
// with key streams (decode/key_streams.hpp: the keys of a step are runs apart) each key's own.
// Found once per step: a lookup per key and head-dim vector cost GPUs more than the products
// (gpu-check's record).
template <class Tr>
struct DecodeStepRows {
  using KV = typename Tr::KV;
  static_assert(DECODE_KEY_RUN % Tr::KEYS_PER_STEP == 0 && Tr::BLOCK_N % DECODE_KEY_RUN == 0,
                "a step within one run of keys");
  const KvRows<KV>& rows;
  const DecodeKeys& keys;
  int t;
  const KV* first = rows.row(keys.template step_key<Tr>(t, 0));
  int last = static_cast<int>(
      std::min<int64_t>(keys.end - 1 - keys.template step_key<Tr>(t, 0), Tr::KEYS_PER_STEP));

  IPEX_FLASH_INLINE const KV* row(int j) const {
    if constexpr (Tr::KEY_STREAMS) return rows.row(keys.template step_key<Tr>(t, j));
    return first + static_cast<int64_t>(std::min(j, last)) * rows.row_stride;
  }
};

// Reads the V rows of step t of one head, returned xor-ed (RowVectors::touch), so that P.V
// finds them in cache: P.V alone issues too few misses at a time to keep memory busy (bf16
// decode +20-30 %). The head-major order's read-ahead, while the K misses are in
// flight.
template <class Tr>
inline uint32_t decode_touch_v(sycl::sub_group sg, const KvRows<typename Tr::KV>& v,
                               const DecodeKeys& keys, int t) {
  const DecodeStepRows<Tr> step{v, keys, t};
  uint32_t touched = 0;
#pragma unroll
  for (int j = 0; j < Tr::KEYS_PER_STEP; ++j)
    touched ^= Tr::Row::template touch<Tr::HEAD_DIM>(sg, step.row(j));
  return touched;
}

// Step-major (the CPU device): step t's K and V rows of every head of the group, read in one
// burst before its scores. The CPU keeps only so many misses in flight, and compute spread
// between them leaves it short of that; a burst fills them (bf16 decode +12 %, FP8 +20-25 %,
// a (B, H, N, D) cache +10-30 %). Key by key, the key's rows of every
// head: one contiguous run of K and one of V in a (B, N, H, D) cache (+10 % over head by head
// there; a (B, H, N, D) cache: the same).
template <class Tr>
inline uint32_t decode_touch_step(sycl::sub_group sg, const DecodeHeads<typename Tr::KV>& heads,
                                  const DecodeKeys& keys, int t) {
  uint32_t touched = 0;
  for (int j = 0; j < Tr::KEYS_PER_STEP; ++j) {
    const int64_t key = keys.template step_key<Tr>(t, j);
    for (int hk = 0; hk < heads.count; ++hk) {
      touched ^= Tr::Row::template touch<Tr::HEAD_DIM>(sg, heads.k(hk).row(key));
      touched ^= Tr::Row::template touch<Tr::HEAD_DIM>(sg, heads.v(hk).row(key));
    }
  }
  return touched;
}

// Whether matrix scores read K tiles in place: when each tile's rows are whole and evenly
// spaced (no pages, or pages of whole tiles, as every page size the API takes is); else from a
// copy in SLM. A tile starts at a multiple of MATRIX_M keys.
template <class Tr>
inline bool decode_k_in_place(const AttentionCommon& c, bool whole_k) {
  return whole_k &&
         (c.seq.block_table == nullptr || c.seq.page_size % std::max(Tr::MATRIX_M, 1) == 0);
}

// S^T of the whole block on the matrix engine: s_t[key][column] = K row . Q^T column, the
// columns of q_tile (packed word [d / 2][column]). K tiles are read in place when the caller
// says their rows are whole and evenly spaced (`k_in_place`) and the block is whole, else from
// a copy in SLM. Ends with a barrier: s_t is complete.
template <class Tr>
inline void decode_matrix_scores(sycl::group<1> group, sycl::sub_group sg,
                                 const KvRows<typename Tr::KV>& k, const DecodeKeys& keys,
                                 bool k_in_place, const uint32_t* q_tile,
                                 float (&s_t)[Tr::MATRIX_KEYS][Tr::LANES],
                                 typename Tr::T (&k_stage)[Tr::MATRIX_KEYS][Tr::HEAD_DIM],
                                 int head_dim, int lid) {
  if constexpr (Tr::MATRIX) {  // only matrix kernels instantiate the products
    using T = typename Tr::T;
    constexpr int BLOCK_N = Tr::BLOCK_N, HEAD_DIM = Tr::HEAD_DIM, LANES = Tr::LANES;
    constexpr int MATRIX_M = Tr::MATRIX_M, MATRIX_K = Tr::MATRIX_K;
    const bool in_place = k_in_place && keys.count == BLOCK_N;
    if (!in_place) {
      load_tile<BLOCK_N, HEAD_DIM>(k_stage, k, keys.begin, keys.count, head_dim, lid, LANES);
      sycl::group_barrier(group);
    }
#pragma unroll
    for (int m0 = 0; m0 < BLOCK_N; m0 += MATRIX_M) {
      if (in_place)
        matrix_product_to_slm<T, MATRIX_M, MATRIX_K, LANES, HEAD_DIM, 1, /*ACCUMULATE=*/false,
                              sycl::access::address_space::global_space>(
            sg, &s_t[m0][0], LANES, k.row(keys.begin + m0), k.row_stride, q_tile, LANES);
      else
        matrix_product_to_slm<T, MATRIX_M, MATRIX_K, LANES, HEAD_DIM, 1, /*ACCUMULATE=*/false>(
            sg, &s_t[m0][0], LANES, &k_stage[m0][0], HEAD_DIM, q_tile, LANES);
    }
    sycl::group_barrier(group);
  }
}

}  // namespace ipex_flash
