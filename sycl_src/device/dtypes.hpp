// Storage types of the inputs and outputs, and their conversions to and from float32, the
// type every kernel computes in.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

namespace ipex_flash {

// bfloat16 by its bit pattern. With intel-sycl-rt 2026.1.2, a kernel that converts through
// sycl::ext::oneapi::bfloat16 crashes the runtime when the persistent kernel cache is on,
// so the conversions are done here by hand (they are exact in this direction, and
// round-to-nearest-even in the other, as torch's own).
struct bfloat16_bits {
  uint16_t bits;
};

inline float to_float(float x) { return x; }
inline float to_float(sycl::half x) { return static_cast<float>(x); }
inline float to_float(bfloat16_bits x) {
  return sycl::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16);
}

template <typename T>
inline T from_float(float x);

template <>
inline float from_float<float>(float x) {
  return x;
}
template <>
inline sycl::half from_float<sycl::half>(float x) {
  return static_cast<sycl::half>(x);
}
template <>
inline bfloat16_bits from_float<bfloat16_bits>(float x) {
  uint32_t u = sycl::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep it a (quiet) NaN, never round to inf
    return bfloat16_bits{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bfloat16_bits{static_cast<uint16_t>(u >> 16)};
}

// FP8 KV-cache elements by their bit patterns (float8_e4m3fn and float8_e5m2; kv_quant.hpp).
// Only read, never written by a kernel: appends are quantised by the caller.
struct float8_e4m3_bits {
  uint8_t bits;
};
struct float8_e5m2_bits {
  uint8_t bits;
};

// e5m2 is the top byte of an IEEE half (same exponent, bias 15, infinities and NaNs).
inline float to_float(float8_e5m2_bits x) {
  return static_cast<float>(sycl::bit_cast<sycl::half>(static_cast<uint16_t>(x.bits << 8)));
}
// e4m3fn (bias 7, no infinities, S.1111.111 is NaN): its exponent and mantissa moved into a
// half's fields give the same number times 2^-8, subnormals included, so one conversion the
// hardware does and one exact multiply.
inline float to_float(float8_e4m3_bits x) {
  const uint32_t magnitude = x.bits & 0x7fu;
  const uint16_t half_bits = static_cast<uint16_t>(((x.bits & 0x80u) << 8) | (magnitude << 7));
  const float value = static_cast<float>(sycl::bit_cast<sycl::half>(half_bits)) * 256.f;
  return magnitude == 0x7fu ? sycl::bit_cast<float>(0x7fc00000u) : value;
}

// Two 16-bit values in one 32-bit word, the first in the low half: the packed (VNNI) layout of
// the matrix engines' B operands (matrix_tile.hpp).
template <typename T>
inline uint32_t pack_pair(T low, T high) {
  static_assert(sizeof(T) == 2, "16-bit types only");
  return static_cast<uint32_t>(sycl::bit_cast<uint16_t>(low)) |
         static_cast<uint32_t>(sycl::bit_cast<uint16_t>(high)) << 16;
}

}  // namespace ipex_flash
