// The attention mask as arithmetic on indices: which key blocks a query block must visit,
// which of those straddle a boundary (and so need the per-element test), and that test.
#pragma once

#include <algorithm>
#include <limits>

#include "common/params.hpp"
#include "common/seq_info.hpp"

namespace ipex_flash {

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
  template <int N>
  static inline void hide_outside(float (&scores)[N], int64_t lo, int64_t hi) {
    const int first = static_cast<int>(std::clamp<int64_t>(lo, 0, N));
    const int last = static_cast<int>(std::clamp<int64_t>(hi, -1, N));
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (j < first || j > last) scores[j] = -std::numeric_limits<float>::infinity();
  }
};

}  // namespace ipex_flash
