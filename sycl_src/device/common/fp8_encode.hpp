// float32 to FP8 (float8_e4m3fn, float8_e5m2), rounded to nearest, ties to even, saturating at
// the format's largest finite value, NaN kept: what torch's (x / descale).clamp(-max, max)
// .to(float8) gives, so that a kernel's append into an FP8 cache stores the general path's
// bytes (kvcache/append_kernels.hpp).
#pragma once

#include <sycl/sycl.hpp>

#include "common/dtypes.hpp"

namespace ipex_flash {

template <typename FP8>
struct Fp8Format;
template <>
struct Fp8Format<float8_e4m3_bits> {
  static constexpr int mantissa_bits = 3, bias = 7;
  static constexpr uint32_t max_code = 0x7e, nan_code = 0x7f;  // 448; S.1111.111
};
template <>
struct Fp8Format<float8_e5m2_bits> {
  static constexpr int mantissa_bits = 2, bias = 15;
  static constexpr uint32_t max_code = 0x7b, nan_code = 0x7f;  // 57344; a quiet NaN
};

template <typename FP8>
inline FP8 fp8_from_float(float x) {
  using F = Fp8Format<FP8>;
  const uint32_t bits = sycl::bit_cast<uint32_t>(x), sign = (bits >> 24) & 0x80u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return FP8{static_cast<uint8_t>(sign | F::nan_code)};
  const int exponent = static_cast<int>(magnitude >> 23) - 127 + F::bias;  // the FP8 field's
  uint32_t mantissa = magnitude & 0x7fffffu;
  // Bits of the float32 mantissa dropped: 23 - M for a normal FP8 result, more for a
  // subnormal one, whose implicit leading 1 becomes explicit.
  int dropped = 23 - F::mantissa_bits;
  uint32_t kept_base = static_cast<uint32_t>(exponent) << F::mantissa_bits;
  if (exponent <= 0) {
    if (magnitude < 0x00800000u) return FP8{static_cast<uint8_t>(sign)};  // zero, tiny
    mantissa |= 0x800000u;
    dropped += 1 - exponent;
    kept_base = 0;
    if (dropped > 24) return FP8{static_cast<uint8_t>(sign)};  // below half the least subnormal
  }
  uint32_t code = kept_base + (mantissa >> dropped);
  const uint32_t rest = mantissa & ((1u << dropped) - 1u), half = 1u << (dropped - 1);
  if (rest > half || (rest == half && (code & 1u))) ++code;  // a carry moves into the exponent
  return FP8{static_cast<uint8_t>(sign | sycl::min(code, F::max_code))};
}

}  // namespace ipex_flash
