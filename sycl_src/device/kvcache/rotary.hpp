// The rotary embedding of flash_attn_with_kvcache (RotaryParams), one feature at a time, in
// float32 and rounded to the row's dtype as the general path stores a rotated row: what the
// append kernel writes (kvcache/append_kernels.hpp) and what the decode kernel reads its new
// keys and queries as when it appends itself (decode/append.hpp, decode/rows.hpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/dtypes.hpp"
#include "common/params.hpp"
#include "kvcache/params.hpp"

namespace ipex_flash {

// Feature d of `row` rotated at `position`; features past rotary_dim are the row's own.
template <typename T, typename COS>
inline T rotated_element(const RotaryParams& r, const T* row, int d, int64_t position) {
  if (d >= r.rotary_dim) return row[d];
  const int half = r.rotary_dim / 2;
  const int i = r.interleaved ? d / 2 : d % half;  // the pair's table column
  const int a = r.interleaved ? 2 * i : i, b = r.interleaved ? 2 * i + 1 : i + half;
  const float x = to_float(row[a]), y = to_float(row[b]);
  // (a position past the tables, which probes/cache_check_kernel.hpp reports, reads their
  // nearest row)
  if (r.rows > 0) position = std::min<int64_t>(std::max<int64_t>(position, 0), r.rows - 1);
  const float c = to_float(static_cast<const COS*>(r.cos)[position * r.cos_stride + i]);
  const float s = to_float(static_cast<const COS*>(r.sin)[position * r.cos_stride + i]);
  return from_float<T>(d == a ? x * c - y * s : x * s + y * c);
}

}  // namespace ipex_flash
