// The user's attention mask (SDPA's attn_mask), read in place through its strides: a
// broadcast dimension has stride 0, so a (1, 1, Nq, Nk) mask serves every batch entry and head
// without a copy. Applied after softcap and ALiBi (score/softcap_alibi.hpp), in the exp2 domain.
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>
#include <cstdint>

#include "common/dtypes.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "common/seq_info.hpp"

namespace ipex_flash {

// One (batch, head) plane of the mask, and the sequence's extent: elements past it are never
// read (the kernels' index mask hides them).
struct AttnMaskPlane {
  const uint8_t* base;  // address of element (b, h, 0, 0); null: no mask
  int64_t row_stride;   // bytes
  int64_t col_stride;
  int64_t len_q;
  int64_t len_k;
  const uint32_t* bits;  // the plane as bits (with_bits), where packed
  int bits_row;          // words; a plane's words fit 32 bits (the host checks)

  static inline AttnMaskPlane of(const AttentionCommon& c, const SeqInfo& seq, int b, int h) {
    const AttnMaskParams& m = c.score_mod.attn_mask;
    const uint8_t* base = static_cast<const uint8_t*>(m.data);
    if (base != nullptr) base += b * m.batch + h * m.head;
    return AttnMaskPlane{base, m.row, m.col, seq.len_q, seq.len_k, nullptr, 0};
  }

  // The same plane reading a bool mask's bits (the register backward's, packed).
  inline AttnMaskPlane with_bits(const MaskBitsParams& m, int b, int h) const {
    AttnMaskPlane plane = *this;
    plane.bits = m.words + b * m.batch + h * m.head;
    plane.bits_row = static_cast<int>(m.row);
    return plane;
  }

  // The packed bool mask's bits of row `row` from key key0 on (bit j: key key0 + j; up to the
  // end of key0's word of 32), for the register backward. A row past the sequence reads its
  // last row (its scores are never used); keys past it read 0 or the mask's own values, which
  // the index mask hides. Words run to the end of the last key block (mask_bits_words).
  inline uint32_t key_bits(int64_t row, int64_t key0) const {
    const int r = static_cast<int>(row < len_q ? row : len_q - 1);
    return bits[r * bits_row + static_cast<int>(key0 >> 5)] >> (key0 & 31);
  }

  // scores[j] = -inf where bit j of `visible` is clear: a lane's row against keys key0 + j
  // (key_bits(row, key0)).
  template <int N>
  static inline void hide_by_bits(float (&scores)[N], uint32_t visible) {
#pragma unroll
    for (int j = 0; j < N; ++j)
      if ((visible & (1u << j)) == 0) scores[j] = NEG_INF;
  }

  // The same for a lane's key against rows row0 + j, j < N: lane j reads row row0 + j's bits of
  // the sub-group's N keys (from the lane's key less its lane index, a multiple of N) and each
  // lane tests its own bit of each row's, read through a broadcast: a word load a row.
  template <int N>
  inline void hide_rows_by_bits(sycl::sub_group sg, float (&scores)[N], int64_t row0,
                                int64_t key) const {
    const int lane = static_cast<int>(sg.get_local_id()[0]);
    const uint32_t row_bits = key_bits(row0 + lane, key - lane);
    const uint32_t lane_bit = 1u << lane;
#pragma unroll
    for (int j = 0; j < N; ++j)
      if ((sycl::group_broadcast(sg, row_bits, j) & lane_bit) == 0) scores[j] = NEG_INF;
  }

  // The element `offset` bytes from base as an exp2-domain addend: 0 or -inf for a bool mask.
  template <int FEATURES>
  inline float addend(int64_t offset) const {
    const uint8_t* at = base + offset;
    if constexpr ((FEATURES & FEATURE_MASK_BOOL) != 0) {
      return *at != 0 ? 0.f : NEG_INF;
    } else if constexpr ((FEATURES & FEATURE_MASK_F32) != 0) {
      return *reinterpret_cast<const float*>(at) * LOG2E;
    } else if constexpr ((FEATURES & FEATURE_MASK_F16) != 0) {
      return to_float(*reinterpret_cast<const sycl::half*>(at)) * LOG2E;
    } else {
      return to_float(*reinterpret_cast<const bfloat16_bits*>(at)) * LOG2E;
    }
  }

  // Adds the mask to scores[j], the score of (row0 + j * row_step, key0 + j * key_step). The
  // bounds are taken once in 64 bits; per element only a 32-bit count is compared (64-bit
  // integers are emulated on Arc A-series and Meteor Lake GPUs).
  template <int FEATURES, int N>
  inline void apply(float (&scores)[N], int64_t row0, int64_t key0, int row_step,
                    int key_step) const {
    if constexpr ((FEATURES & FEATURE_ATTN_MASK) != 0) {
      const int valid = std::min(inside(len_q - row0, row_step, N), inside(len_k - key0, key_step, N));
      const int64_t offset0 = row0 * row_stride + key0 * col_stride;
      const int64_t step = row_step * row_stride + key_step * col_stride;
#pragma unroll
      for (int j = 0; j < N; ++j)
        if (j < valid) scores[j] += addend<FEATURES>(offset0 + j * step);
    }
  }

  // Whether the user's mask hides every element of rows [row0, row_end) x keys [key0,
  // key_end): the backward kernels skip such blocks. Always false without a mask (FEATURES);
  // otherwise collective over the work-group, as any_visible.
  template <int FEATURES>
  inline bool hides_block(sycl::group<1> group, float& slot, int64_t row0, int64_t row_end,
                          int64_t key0, int64_t key_end, int lid, int lanes) const {
    if constexpr ((FEATURES & FEATURE_ATTN_MASK) == 0) {
      return false;
    } else {
      return !any_visible<FEATURES>(group, slot, row0, static_cast<int>(row_end - row0), key0,
                                    static_cast<int>(key_end - key0), lid, lanes);
    }
  }

  // Whether any element of rows [row0, row0 + rows) x keys [key0, key0 + keys) (both inside the
  // sequence) is visible; the work-group's `lanes` items scan it together, a row each, and
  // meet in `slot`, a float of local memory the caller's next step overwrites after a barrier
  // (a tile about to be reloaded). Not sycl::any_of_group: on Intel GPUs it takes local memory
  // of its own, which tiles sized to the device's limit do not leave.
  template <int FEATURES>
  inline bool any_visible(sycl::group<1> group, float& slot, int64_t row0, int rows,
                          int64_t key0, int keys, int lid, int lanes) const {
    bool any = false;
    for (int r = lid; r < rows && !any; r += lanes)
      any = line_visible<FEATURES>(row0 + r, key0, 0, 1, keys);
    sycl::group_barrier(group);  // the slot's previous readers are done
    if (lid == 0) slot = 0.f;
    sycl::group_barrier(group);
    if (any) slot = 1.f;  // every writer writes the same value
    sycl::group_barrier(group);
    return slot != 0.f;
  }

  // hides_block for the register kernels, whose sub-groups share nothing else and skip alone:
  // each lane scans its own line of the block, `length` elements from (row, key) on, stepping
  // (row_step, key_step) (its query row across the keys, or its key down the rows), if `valid`,
  // and the sub-group votes. No local memory. SPAN: the block's keys or rows (length at most);
  // LANES: the sub-group's. A bool mask is read as bits there (key_bits, the keys 32-aligned):
  // a word a lane's row of 32 keys, and down a lane's key a word a row, each lane reading every
  // LANES-th row and the sub-group ORing them.
  template <int FEATURES, int SPAN, int LANES>
  inline bool hides_lines(sycl::sub_group sg, bool valid, int64_t row, int64_t key,
                          int row_step, int key_step, int length) const {
    if constexpr ((FEATURES & FEATURE_ATTN_MASK) == 0) {
      return false;
    } else if constexpr ((FEATURES & FEATURE_MASK_BOOL) != 0) {
      static_assert(SPAN % 32 == 0 && SPAN % LANES == 0, "whole words, whole rows a lane");
      uint32_t seen = 0;
      if (row_step == 0) {  // the lane's row, keys key .. key + length (key_step 1)
#pragma unroll
        for (int k = 0; k < SPAN; k += 32) {
          const int left = length - k;
          seen |= key_bits(row, key + k) & (left >= 32 ? ~0u : left > 0 ? (1u << left) - 1 : 0u);
        }
        return !sycl::any_of_group(sg, valid && seen != 0);
      }
      // the lane's key, rows row .. row + length (row_step 1): the sub-group's keys' bits
      // A rolled loop: unrolled, its addresses held from the kernel's start spilled (DG2,
      // PVC; gpu-check's record).
      const int lane = static_cast<int>(sg.get_local_id()[0]);
      const uint32_t* words = bits + static_cast<int>(row + lane) * bits_row +
                              static_cast<int>((key - lane) >> 5);
#pragma unroll 1
      for (int r = lane; r < length; r += LANES, words += LANES * bits_row) seen |= *words;
      seen = sycl::reduce_over_group(sg, seen >> ((key - lane) & 31), sycl::bit_or<uint32_t>());
      return !sycl::any_of_group(sg, valid && (seen >> lane & 1u) != 0);
    } else {
      const bool any = valid && line_visible<FEATURES>(row, key, row_step, key_step, length);
      return !sycl::any_of_group(sg, any);
    }
  }

 private:
  // Whether any of `length` elements from (row, key) on, stepping (row_step, key_step), is
  // visible: one item's share of any_visible and hides_lines.
  template <int FEATURES>
  inline bool line_visible(int64_t row, int64_t key, int row_step, int key_step,
                           int64_t length) const {
    const int64_t offset = row * row_stride + key * col_stride;
    const int64_t step = row_step * row_stride + key_step * col_stride;
    bool any = false;
    for (int64_t j = 0; j < length && !any; ++j) any = addend<FEATURES>(offset + j * step) > NEG_INF;
    return any;
  }

  // How many j in [0, N) satisfy j * step < left.
  static inline int inside(int64_t left, int step, int n) {
    if (left <= 0) return 0;
    if (step == 0) return n;
    return static_cast<int>(std::min<int64_t>(left, n));
  }
};

}  // namespace ipex_flash
