// The attention mask as arithmetic on indices: which key blocks a query block must visit,
// which of those straddle a boundary (and so need the per-element test), and that test.
#pragma once

#include "params.hpp"

namespace ipex_flash {

struct BlockMask {
  MaskParams mask;
  int32_t len_k;

  // Keys [begin, end) that any row in [row_begin, row_end) can see; blocks outside are
  // never visited. Returns an empty range (begin >= end) when no row sees any key.
  inline int64_t first_key(int64_t row_begin) const {
    if (mask.window_left < 0) return 0;
    int64_t c = row_begin + mask.diag_offset - mask.window_left;
    return c < 0 ? 0 : c;
  }
  inline int64_t end_key(int64_t row_end) const {
    if (mask.window_right < 0) return len_k;
    int64_t c = row_end - 1 + mask.diag_offset + mask.window_right + 1;
    return c < len_k ? (c < 0 ? 0 : c) : len_k;
  }

  // True when every (row, key) of the block is visible, so the element test can be skipped.
  inline bool block_fully_visible(int64_t row_begin, int64_t row_end, int64_t key_begin,
                                  int64_t key_end) const {
    if (key_end > len_k) return false;
    if (mask.window_right >= 0 && key_end - 1 > row_begin + mask.diag_offset + mask.window_right)
      return false;
    if (mask.window_left >= 0 && key_begin < row_end - 1 + mask.diag_offset - mask.window_left)
      return false;
    return true;
  }

  inline bool visible(int64_t row, int64_t key) const {
    if (key >= len_k) return false;
    if (mask.window_right >= 0 && key > row + mask.diag_offset + mask.window_right) return false;
    if (mask.window_left >= 0 && key < row + mask.diag_offset - mask.window_left) return false;
    return true;
  }
};

}  // namespace ipex_flash
