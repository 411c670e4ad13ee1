// FP8 KV caches: K and V stored as float8_e4m3fn or float8_e5m2 with descale factors per
// (batch, K/V head), read by the same kernels as 16-bit caches. A kernel's FEATURES say the
// cache's element type (kv_storage_t); elements are converted to float32 as they are loaded
// (common/dtypes.hpp), and the descales never touch an element:
//   scores  q . (k_descale * k) = (k_descale * q) . k: folded into Q's scale on load;
//   output  sum_j p_j (v_descale * v_j) = v_descale * sum_j p_j v_j: folded into the final
//           normalisation.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/dtypes.hpp"
#include "common/params.hpp"

namespace ipex_flash {

// The element type of K and V for a kernel of input type T: T, or an FP8 type.
template <typename T, int FEATURES>
using kv_storage_t =
    std::conditional_t<(FEATURES & FEATURE_KV_E4M3) != 0, float8_e4m3_bits,
                       std::conditional_t<(FEATURES & FEATURE_KV_E5M2) != 0, float8_e5m2_bits,
                                          T>>;

struct KvDescale {
  float k;
  float v;
};

// The descales of sequence b's K/V head h_kv; 1 in kernels compiled for other caches, which
// carry none of this code (on DG2 the loads alone made the fp32 forward spill).
template <int FEATURES>
inline KvDescale kv_descale(const AttentionCommon& c, int b, int h_kv) {
  if constexpr ((FEATURES & FEATURE_KV_FP8) == 0) return KvDescale{1.f, 1.f};
  if (c.kv_descale.k == nullptr) return KvDescale{1.f, 1.f};
  const int64_t i = static_cast<int64_t>(b) * c.dims.heads_kv() + h_kv;
  return KvDescale{c.kv_descale.k[i], c.kv_descale.v[i]};
}

}  // namespace ipex_flash
