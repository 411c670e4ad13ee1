// The decode kernel's compile-time shape (flash-attn's "kernel traits"): how a work-group's
// query rows, a key block's keys and the head dim are dealt to its DECODE_LANES lanes, and the
// order of its loops on each device; with the run-time descriptions of a key block and of the
// K/V columns that every step of the kernel takes (decode/kernel.hpp, decode/scores.hpp).
// Dimension legend: r = query rows of the group, j = keys of a step, t = steps of a block,
// v = head-dim vectors (LANES columns each).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/kv_quant.hpp"
#include "common/params.hpp"
#include "decode/params.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

// Independent accumulators a lane keeps in the P.V loop: enough chains of dependent FMAs to
// hide their latency when the group has few rows.
constexpr int DECODE_PV_CHAINS = 8;

// The order of a key block's vector score steps over the group's heads. On the CPU device,
// step-major: a step reads its keys' rows for every head before the next keys, so a (B, N, H,
// D) cache is walked in memory order (fp32 decode 1.3x, bf16 1.35x, FP8 1.7x), and the scores
// of every head wait in SLM for the block's softmax and P.V. On GPUs, head-major, each head's
// scores, softmax and P.V together: step-major made DG2, Meteor Lake and Arrow Lake-H spill
// (gpu-check's record).
#if defined(IPEX_FLASH_CPU_LOOPS)
constexpr bool DECODE_STEP_MAJOR = true;
constexpr bool DECODE_CPU_DEVICE = true;  // decode_row_capacity
#else
constexpr bool DECODE_STEP_MAJOR = false;
constexpr bool DECODE_CPU_DEVICE = false;
#endif

// Whether a call of one split writes its output in the decode kernel, with no merge launch:
// where registers allow it (the 256-register GPUs, the CPU device). On GPUs with 128 registers
// that write's code made the 16-bit one-row kernels spill (gpu-check's record).
#if defined(IPEX_FLASH_CPU_LOOPS) || defined(IPEX_FLASH_LARGE_GRF)
constexpr bool DECODE_ONE_SPLIT_WRITES = true;
#else
constexpr bool DECODE_ONE_SPLIT_WRITES = false;
#endif

// Head-dim vectors per P.V pass: the most, up to `wanted`, that split d_vecs into whole passes
// of whole loads (per_load divides d_vecs).
constexpr int decode_pv_vecs(int d_vecs, int per_load, int wanted) {
  int vecs = wanted < d_vecs ? wanted : d_vecs;
  vecs = vecs < per_load ? per_load : vecs - vecs % per_load;
  while (d_vecs % vecs != 0) vecs -= per_load;
  return vecs;
}

// GROUP_ROWS: the query rows of one K/V head (GQA group size x new tokens) rounded up to a
// power of two (<= DECODE_LANES). BLOCK_N: keys per online-softmax update (and the granularity
// of the splits). A work-group serves up to MAX_HEADS consecutive K/V heads, visiting each key
// block for all of them before moving on: with a (B, N, H, D) cache a key's heads are
// neighbours in memory, so the group reads one contiguous run per key instead of H runs a page
// apart, which the CPU's prefetchers cannot follow.
//
// MATRIX_M > 0 (16-bit inputs on a device with a matrix engine): the scores of a key block
// come from the matrix engine instead, S^T (keys, columns) = K (keys, d) . Q^T (d, columns),
// with K tiles loaded straight from the cache (any row stride) and Q^T packed in SLM, whose
// MATRIX_N = LANES columns are the rows of HEADS_PER_SET heads (so N = 16 only: DG2's N = 8
// would need the whole kernel on 8 lanes); each head's product uses its own columns.
template <typename T_, int HEAD_DIM_, int GROUP_ROWS_, int BLOCK_N_, int FEATURES_, int MATRIX_M_,
          int MATRIX_K_, int MATRIX_N_>
struct DecodeTraits {
  using T = T_;                                      // Q's (and a 16-bit cache's) elements
  using KV = kv_storage_t<T, FEATURES_>;             // the cache's: T, or FP8 (common/kv_quant.hpp)
  // FEATURE_ROTARY: the tables' elements (kvcache/rotary.hpp).
  using Cos = std::conditional_t<(FEATURES_ & FEATURE_ROTARY_F32) != 0, float, T>;
  static constexpr bool ROTARY = (FEATURES_ & FEATURE_ROTARY) != 0;
  static constexpr int LANES = DECODE_LANES;
  using Row = RowVectors<KV, LANES>;
  static constexpr int HEAD_DIM = HEAD_DIM_, GROUP_ROWS = GROUP_ROWS_, BLOCK_N = BLOCK_N_;
  static constexpr int FEATURES = FEATURES_;
  static constexpr int MATRIX_M = MATRIX_M_, MATRIX_K = MATRIX_K_, MATRIX_N = MATRIX_N_;
  static constexpr int MAX_HEADS = decode_row_capacity(HEAD_DIM, DECODE_CPU_DEVICE) / GROUP_ROWS;
  static constexpr int KEYS_PER_STEP = LANES / GROUP_ROWS;  // one step's scores fill the lanes
  static constexpr int STEPS = BLOCK_N / KEYS_PER_STEP;
  static constexpr int D_VECS = HEAD_DIM / LANES;
  static constexpr int PER_LOAD = Row::PER_LOAD;  // head-dim vectors per block load
  static constexpr int PV_VECS = decode_pv_vecs(D_VECS, PER_LOAD, DECODE_PV_CHAINS / GROUP_ROWS);
  static constexpr bool MATRIX = MATRIX_M > 0;
  static constexpr bool STEP_MAJOR = DECODE_STEP_MAJOR && !MATRIX;  // matrix: head by head
  // The keys as streams (decode/key_streams.hpp), step-major only.
  static constexpr bool KEY_STREAMS = STEP_MAJOR && (FEATURES & FEATURE_KEY_STREAMS) != 0;
  // A block's probabilities in SLM: every head's where all heads' scores come before the
  // softmax (step-major), one head's otherwise.
  static constexpr int PROB_HEADS = STEP_MAJOR ? MAX_HEADS : 1;
  // Each head's rescale of O for the block: the streams' P.V, step-major, needs every head's.
  static constexpr int FACTOR_HEADS = KEY_STREAMS ? MAX_HEADS : 1;
  static constexpr int HEADS_PER_SET = LANES / GROUP_ROWS;  // heads sharing one Q^T tile
  static constexpr int SETS = (MAX_HEADS + HEADS_PER_SET - 1) / HEADS_PER_SET;
  // Sizes of the matrix scores' buffers: one element in vector kernels.
  static constexpr int MATRIX_SETS = MATRIX ? SETS : 1, MATRIX_KEYS = MATRIX ? BLOCK_N : 1;

  static_assert(GROUP_ROWS <= LANES && LANES % GROUP_ROWS == 0, "rows must tile the lanes");
  static_assert(BLOCK_N % KEYS_PER_STEP == 0 && HEAD_DIM % LANES == 0, "tile shape");
  static_assert(D_VECS % PV_VECS == 0 && PV_VECS % PER_LOAD == 0, "whole P.V passes");
  static_assert(!MATRIX || (LANES == MATRIX_N && BLOCK_N % MATRIX_M == 0 &&
                            HEAD_DIM % MATRIX_K == 0 && sizeof(T) == 2 &&
                            std::is_same_v<KV, T>),
                "matrix tile shape");
};

// What decode_append and DecodeRows::q_element read of a kernel's shape (DecodeTraits's
// names): flash_attn_with_kvcache's append, and its rotary embedding, as the vector form does
// them.
template <typename T_, int FEATURES_>
struct DecodeXmxShape {
  using T = T_;
  using KV = kv_storage_t<T_, FEATURES_>;
  using Cos = std::conditional_t<(FEATURES_ & FEATURE_ROTARY_F32) != 0, float, T_>;
  static constexpr bool ROTARY = (FEATURES_ & FEATURE_ROTARY) != 0;
  static constexpr int LANES = DECODE_LANES, FEATURES = FEATURES_;
};

// The key block a work-group is visiting, within its split.
struct DecodeKeys {
  int64_t begin;  // the block's first key
  int64_t end;    // the split's end (exclusive)
  int count;      // keys in the block: min(BLOCK_N, end - begin) (BLOCK_N with key streams)
  int64_t stream_len = 0;  // KEY_STREAMS: keys from one stream's start to the next's

  // Key j of step t of the block: consecutive keys, or with key streams the t-th key of stream
  // j (decode/key_streams.hpp).
  template <class Tr>
  int64_t key(int t, int j) const {
    if constexpr (Tr::KEY_STREAMS)
      return begin + t + j * stream_len;
    else
      return begin + t * Tr::KEYS_PER_STEP + j;
  }
  // The same clamped to the split's last key: a partial block's missing keys read the last row
  // again, and the mask drops them.
  template <class Tr>
  int64_t step_key(int t, int j) const {
    return std::min<int64_t>(key<Tr>(t, j), end - 1);
  }
};

// A split's keys [first, end) as key blocks: BLOCK_N consecutive keys each from `first`, or
// with key streams (decode/key_streams.hpp) STEPS keys of each of KEYS_PER_STEP runs of stream_len
// keys (whole blocks' worth; the last run may pass `end`, and the mask drops those keys).
template <class Tr>
struct DecodeBlocks {
  int64_t first, end;
  int64_t stream_len = Tr::KEY_STREAMS ? (std::max<int64_t>(end - first, 0) + Tr::BLOCK_N - 1) /
                                             Tr::BLOCK_N * Tr::STEPS
                                       : 0;

  int64_t begins_end() const { return Tr::KEY_STREAMS ? first + stream_len : end; }
  int64_t next(int64_t begin) const { return begin + (Tr::KEY_STREAMS ? Tr::STEPS : Tr::BLOCK_N); }
  DecodeKeys at(int64_t begin) const {
    return {begin, end,
            Tr::KEY_STREAMS ? Tr::BLOCK_N
                            : static_cast<int>(std::min<int64_t>(Tr::BLOCK_N, end - begin)),
            stream_len};
  }
};

// The columns of K and V that the cache holds: whole rows (a head dim the kernel was compiled
// for) are read with block loads, a padded head dim lane by lane.
struct DecodeColumns {
  int head_dim;    // Q's and K's
  int head_dim_v;  // V's and O's
  bool whole_k;
  bool whole_v;
};

}  // namespace ipex_flash
