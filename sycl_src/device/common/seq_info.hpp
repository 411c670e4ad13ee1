// Per-sequence offsets and lengths, resolved in one place for every kernel: fixed-length
// batches, packed variable-length batches (cu_seqlens) and KV caches (seqlens_k).
#pragma once

#include <cstdint>

#include "common/params.hpp"

namespace ipex_flash {

struct SeqInfo {
  int64_t q_row0;  // first row of sequence b in packed q / out / lse (0 for fixed length)
  int64_t k_row0;  // first row of sequence b in packed k / v (0 for fixed length, a cache's k_start)
  int32_t len_q;   // query rows of sequence b
  int32_t len_k;   // keys of sequence b
  int64_t diag;    // the mask's diagonal: key seen by row 0 (see MaskParams); for a block of a
                   // larger attention (GlobalPositions) the global one, row 0's position
                   // minus key 0's, which windows, causal and ALiBi are then measured from
};

inline SeqInfo seq_info(const AttentionCommon& c, int b) {
  SeqInfo s{0, 0, c.dims.len_q, c.dims.len_k, 0};
  if (c.seq.cu_seqlens_q != nullptr) {
    s.q_row0 = c.seq.cu_seqlens_q[b];
    s.len_q = c.seq.cu_seqlens_q[b + 1] - c.seq.cu_seqlens_q[b];
  }
  if (c.seq.cu_seqlens_k != nullptr) {
    s.k_row0 = c.seq.cu_seqlens_k[b];
    s.len_k = c.seq.cu_seqlens_k[b + 1] - c.seq.cu_seqlens_k[b];
  }
  if (c.seq.seqlens_k != nullptr) s.len_k = c.seq.seqlens_k[b] + c.seq.keys_appended;
  if (c.seq.k_start != nullptr) {  // cache_leftpad: key 0 is cache row k_start[b]
    s.k_row0 += c.seq.k_start[b];
    s.len_k -= c.seq.k_start[b];
  }
  s.diag = c.mask.bottom_right ? static_cast<int64_t>(s.len_k) - s.len_q : 0;
  if (c.positions.table != nullptr) {  // a block of a larger attention: its global diagonal
    const int64_t* entry = c.positions.entry(b);
    s.diag = entry[1] - entry[2];
  }
  return s;
}

// seq_info for the decode kernel, whose launch plan may leave a KV cache's values to the
// device to check (probes/cache_check_kernel.hpp): a sequence whose length or start is out of
// the cache's bounds has no keys. The other kernels run on values the host checked, without
// this code and its registers.
inline SeqInfo bounded_seq_info(const AttentionCommon& c, const CacheBounds& bounds, int b) {
  SeqInfo s = seq_info(c, b);
  if (c.seq.seqlens_k != nullptr) {
    const int64_t keys = c.seq.seqlens_k[b];
    const int64_t start = c.seq.k_start != nullptr ? c.seq.k_start[b] : 0;
    // (start first: in the other order Arc A, Meteor Lake and Arrow Lake-H built the one-row
    // kernels 10 % longer)
    if (!start_within_keys(start, keys) ||
        !keys_fit_cache(keys, c.seq.keys_appended, bounds.key_capacity)) {
      s.k_row0 = 0;
      s.len_k = 0;
      s.diag = c.mask.bottom_right ? -static_cast<int64_t>(s.len_q) : 0;
    }
  }
  return s;
}

// Index of the LSE (and delta) of row r of sequence s, head h.
inline int64_t lse_index(const AttentionCommon& c, const SeqInfo& s, int b, int h, int64_t r) {
  return b * c.lse_stride.batch + h * c.lse_stride.head + s.q_row0 + r;
}

}  // namespace ipex_flash
