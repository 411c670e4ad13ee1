// The attention mask as arithmetic on indices: which key blocks a query block must visit,
// which of those straddle a boundary (and so need the per-element test), and that test; and
// the walk over blocks that runs the others through a loop without the test (run_blocks).
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>

#include "common/params.hpp"
#include "common/seq_info.hpp"

namespace ipex_flash {

// Blocks on a grid (starts first, first + size, ... below an end) as the starts [begin, end)
// of a run of them, both on the grid; empty when begin == end.
struct BlockRun {
  int64_t begin, end;
  static inline BlockRun none(int64_t first) { return BlockRun{first, first}; }
};

struct BlockMask {
  int64_t diag;          // key on the diagonal of row 0
  int32_t window_left;   // -1 = unbounded
  int32_t window_right;  // -1 = unbounded
  int32_t len_k;

  static inline BlockMask of(const MaskParams& mask, const SeqInfo& seq) {
    return BlockMask{seq.diag, mask.window_left, mask.window_right, seq.len_k};
  }

  // Keys [first_key, end_key) that any row in [row_begin, row_end) can see; blocks outside
  // are never visited. The range is empty (first >= end) when no row sees any key.
  inline int64_t first_key(int64_t row_begin) const {
    if (window_left < 0) return 0;
    int64_t c = row_begin + diag - window_left;
    return c < 0 ? 0 : c;
  }
  inline int64_t end_key(int64_t row_end) const {
    if (window_right < 0) return len_k;
    int64_t c = row_end - 1 + diag + window_right + 1;
    return c < len_k ? (c < 0 ? 0 : c) : len_k;
  }

  // Rows [first_row, end_row) that can see any key in [key_begin, key_end): the backward's
  // dK/dV kernel visits only those query blocks.
  inline int64_t first_row(int64_t key_begin) const {
    if (window_right < 0) return 0;
    int64_t r = key_begin - diag - window_right;
    return r < 0 ? 0 : r;
  }
  inline int64_t end_row(int64_t key_end, int64_t len_q) const {
    if (window_left < 0) return len_q;
    int64_t r = key_end - 1 - diag + window_left + 1;
    return r < len_q ? (r < 0 ? 0 : r) : len_q;
  }

  // True when every (row, key) of the block is visible, so the element test can be skipped.
  inline bool block_fully_visible(int64_t row_begin, int64_t row_end, int64_t key_begin,
                                  int64_t key_end) const {
    if (key_end > len_k) return false;
    if (window_right >= 0 && key_end - 1 > row_begin + diag + window_right)
      return false;
    if (window_left >= 0 && key_begin < row_end - 1 + diag - window_left)
      return false;
    return true;
  }

  // The blocks of `size` keys, starting at first, first + size, ... below end, that every row
  // in [row_begin, row_end) sees whole (block_fully_visible): one run, as each of that test's
  // bounds on a block's start is monotone (below: the keys' end and a window's right edge;
  // above: a window's left edge). Under a causal mask or a window the run is the middle of the
  // blocks, the diagonal's and the edges' on either side of it.
  inline BlockRun fully_visible_key_blocks(int64_t row_begin, int64_t row_end, int64_t first,
                                           int64_t end, int size) const {
    int64_t last = len_k - size;  // start + size <= len_k
    if (window_right >= 0)  // start + size - 1 <= row_begin + diag + window_right
      last = std::min<int64_t>(last, row_begin + diag + window_right - size + 1);
    // start >= row_end - 1 + diag - window_left
    const int64_t least = window_left >= 0 ? row_end - 1 + diag - window_left : first;
    return run_on_grid(least, last, first, end, size);
  }

  // The same mask seeing no key right of the diagonal: its fully visible key blocks are those
  // of this mask that no row passes the diagonal of (the forward's lean loop with ALiBi,
  // ScoreMod::apply_left_of_diagonal).
  inline BlockMask left_of_diagonal() const {
    BlockMask left = *this;
    left.window_right = 0;
    return left;
  }

  // The whole blocks of query rows [start, start + size), start + size <= len_q, starting at
  // first, first + size, ... below end, that see every key of [key_begin, key_end) (the dK/dV
  // kernel's walk over the query blocks for one key block; block_fully_visible as it asks).
  // Whole: the lean form of that walk then takes a block's rows as a constant.
  inline BlockRun fully_visible_row_blocks(int64_t key_begin, int64_t key_end, int64_t first,
                                           int64_t end, int size, int64_t len_q) const {
    if (key_end > len_k) return BlockRun::none(first);
    // key_end - 1 <= start + diag + window_right
    const int64_t least = window_right >= 0 ? key_end - 1 - diag - window_right : first;
    int64_t last = std::min<int64_t>(end, len_q - size);
    if (window_left >= 0) {
      // key_begin >= min(start + size, len_q) - 1 + diag - window_left: rows below rows_end
      // see key_begin; every block does when the sequence's rows all do.
      const int64_t rows_end = key_begin + 1 - diag + window_left;
      if (len_q > rows_end) last = rows_end - size;
    }
    return run_on_grid(least, last, first, end, size);
  }

  inline bool visible(int64_t row, int64_t key) const {
    if (key >= len_k) return false;
    if (window_right >= 0 && key > row + diag + window_right) return false;
    if (window_left >= 0 && key < row + diag - window_left) return false;
    return true;
  }

  // Sets to -inf the scores of a register chunk that the mask hides: scores[j] of (row, key0 + j)
  // for a work-item owning a query row, or of (row0 + j, key) for one owning a key.
  // The bounds are taken once, in 64 bits, as the range [lo, hi] of visible j (clamped to a
  // chunk's reach); each element then compares 32-bit j: 64-bit integers are emulated on Arc
  // A-series and Meteor Lake GPUs.
  template <int N>
  inline void apply_to_keys(float (&scores)[N], int64_t row, int64_t key0) const {
    const KeySpan span = key_span(row, key0, N);
    hide_outside(scores, span.first, span.last);
  }

  // The offsets o in [first, last] for which key key0 + o is visible to `row`, clamped to
  // [0, reach] (last = -1: none).
  struct KeySpan {
    int first, last;
  };
  inline KeySpan key_span(int64_t row, int64_t key0, int reach) const {
    int64_t hi = len_k - 1 - key0;  // key0 + o < len_k
    if (window_right >= 0) hi = std::min<int64_t>(hi, row + diag + window_right - key0);
    const int64_t lo = window_left >= 0 ? row + diag - window_left - key0 : 0;
    return KeySpan{static_cast<int>(std::clamp<int64_t>(lo, 0, reach)),
                   static_cast<int>(std::clamp<int64_t>(hi, -1, reach))};
  }
  template <int N>
  inline void apply_to_rows(float (&scores)[N], int64_t row0, int64_t key) const {
    // key <= row0 + j + diag + window_right  <=>  j >= key - row0 - diag - window_right
    const int64_t lo = window_right >= 0 ? key - row0 - diag - window_right : 0;
    const int64_t hi = key >= len_k ? -1
                       : window_left >= 0 ? key - row0 - diag + window_left
                                          : static_cast<int64_t>(N);
    hide_outside(scores, lo, hi);
  }

 private:
  // The starts of the grid first, first + size, ... below end that lie in [least, last].
  static inline BlockRun run_on_grid(int64_t least, int64_t last, int64_t first, int64_t end,
                                     int size) {
    const auto steps_to = [&](int64_t bound) {  // grid steps to the first start >= bound
      return bound <= first ? int64_t{0} : (bound - first + size - 1) / size;
    };
    const int64_t stop = first + steps_to(end) * size;
    const int64_t past = last < first ? first : first + ((last - first) / size + 1) * size;
    const int64_t run_end = std::min(past, stop);
    return BlockRun{std::min(first + steps_to(least) * size, run_end), run_end};
  }

  template <int N>
  static inline void hide_outside(float (&scores)[N], int64_t lo, int64_t hi) {
    const int first = static_cast<int>(std::clamp<int64_t>(lo, 0, N));
    const int last = static_cast<int>(std::clamp<int64_t>(hi, -1, N));
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (j < first || j > last) scores[j] = -std::numeric_limits<float>::infinity();
  }
};

// FlashAttention-2's split of the main loop: block(std::true_type{}, start) runs a block in
// the general form (the per-element mask behind the block's test, dropout behind its flag),
// block(std::false_type{}, start) in the lean one, which has neither in its code; for the
// starts first, first + step, ... below end, in that order (the online softmax's results
// depend on it), the lean form for those of `lean` (the fully visible blocks; none under
// dropout). So a general loop runs the blocks before the lean run (over keys: a window's left
// edge; over query rows, dK/dV: the diagonal), a lean loop the run, and a second general loop
// the blocks after it (the diagonal and the keys' last partial block; a window's left edge):
// the lean loop is a loop of its own in the native code, which gpu-check reads
// (gpu_native.py). One loop around the general and lean loops would hold the general form's
// code once, but values IGC hoisted out of either loop then stayed live through the other:
// the forward at d = 128 spilled on BMG and PVC (docs/gpus.md). SPLIT false: every block in
// the general form, one loop (split_blocks).
template <bool SPLIT, typename Block>
__attribute__((always_inline)) inline void run_blocks(int64_t first, int64_t end, int step,
                                                      BlockRun lean, Block&& block) {
  int64_t start = first;
  if constexpr (SPLIT) {
    for (; start < lean.begin; start += step) block(std::true_type{}, start);
    for (; start < lean.end; start += step) block(std::false_type{}, start);
  }
  for (; start < end; start += step) block(std::true_type{}, start);
}

// Whether the 8-wide register dK/dV of FEATURES and HEAD_DIM splits its blocks so
// (run_blocks): with every score change but a float mask past d = 64, where split it spilled
// in its lean loop (DG2, d = 128). Split, the lean loop issues under half of the one loop's
// instructions per DPAS, and the kernels that spill hold fewer of their spills in their loops
// (DG2, Arrow Lake-H: docs/gpu_loop_costs.md). The 16-wide register kernels split with every
// score change, the forward since softcap's fused tanh and the mask's bits made its blocks'
// code short enough.
template <int FEATURES, int HEAD_DIM>
constexpr bool split_blocks = !wide_float_mask(HEAD_DIM, FEATURES);

// The key blocks [first, end) of query rows [row_begin, row_end) through run_blocks, the
// register forward's and dQ's walk: the fully visible ones in the lean loop, unless SPLIT is
// false or dropout keeps every block general.
template <int FEATURES, bool SPLIT, typename Block>
__attribute__((always_inline)) inline void run_key_blocks(const BlockMask& mask, bool dropout,
                                                          int64_t row_begin, int64_t row_end,
                                                          int64_t first, int64_t end, int size,
                                                          Block&& block) {
  const BlockRun lean = SPLIT && !dropout
                            ? mask.fully_visible_key_blocks(row_begin, row_end, first, end, size)
                            : BlockRun::none(first);
  run_blocks<SPLIT>(first, end, size, lean, block);
}

}  // namespace ipex_flash
