// Storage types of the inputs and outputs, and their conversions to and from float32, the
// type every kernel computes in.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <type_traits>

#if defined(__SYCL_DEVICE_ONLY__)
// SPV_INTEL_bfloat16_conversion: one native instruction on Intel GPUs (and taken by the CPU
// device), where rounding by hand cost five to seven per element (an eighth of the
// GPU forward's main loop).
extern SYCL_EXTERNAL uint16_t __spirv_ConvertFToBF16INTEL(float) noexcept;
#endif

namespace ipex_flash {

// bfloat16 by its bit pattern. With intel-sycl-rt 2026.1.2, a kernel that converts through
// sycl::ext::oneapi::bfloat16 crashes the runtime when the persistent kernel cache is on, so
// the conversions are done here: by hand to float32 (exact), and
// to bfloat16 by the SPIR-V conversion itself (round to nearest even, as torch's own).
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
#if defined(__SYCL_DEVICE_ONLY__)
  return bfloat16_bits{__spirv_ConvertFToBF16INTEL(x)};
#else
  uint32_t u = sycl::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep it a (quiet) NaN, never round to inf
    return bfloat16_bits{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bfloat16_bits{static_cast<uint16_t>(u >> 16)};
#endif
}

// FP8 KV-cache elements by their bit patterns (float8_e4m3fn and float8_e5m2; common/kv_quant.hpp).
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

// Four FP8 elements of one 32-bit word (element u in byte u) in float32, converted two at a time
// as the two halves of a word: bytes 0 and 2, then 1 and 3, each moved into a half's bit
// fields by a few whole-word operations instead of one extraction per byte. e5m2 comes out
// exact; e4m3 as its value / FP8_WORD_UNIT<e4m3> (its fields in a half's, NaN kept), the unit
// the caller folds into a scale it applies anyway (the decode kernel's descales).
template <typename T>
inline constexpr float FP8_WORD_UNIT = 1.f;
template <>
inline constexpr float FP8_WORD_UNIT<float8_e4m3_bits> = 256.f;

inline void halves_to_float(uint32_t even, uint32_t odd, float (&out)[4]) {
  out[0] = static_cast<float>(sycl::bit_cast<sycl::half>(static_cast<uint16_t>(even)));
  out[1] = static_cast<float>(sycl::bit_cast<sycl::half>(static_cast<uint16_t>(odd)));
  out[2] = static_cast<float>(sycl::bit_cast<sycl::half>(static_cast<uint16_t>(even >> 16)));
  out[3] = static_cast<float>(sycl::bit_cast<sycl::half>(static_cast<uint16_t>(odd >> 16)));
}

// The four FP8 elements of a word as half bit patterns, two to a word: `even` holds bytes 0 and
// 2, `odd` 1 and 3 (low half first), in FP8_WORD_UNIT. e5m2 is a half's upper byte. e4m3 two
// bytes at a time, in the high bytes of the two halves (bytes 0 and 2 once shifted, 1 and 3 as
// they are): the sign stays at a half's bit 15, exponent and mantissa move to bits 13..7.
// S.1111.111, the only NaN, is the one magnitude whose carry from an added bit 7 reaches bit 14,
// which then makes the half's exponent all ones: a NaN without a compare per element.
template <typename KV>
inline void fp8_word_halves(uint32_t word, uint32_t& even, uint32_t& odd) {
  if constexpr (std::is_same_v<KV, float8_e5m2_bits>) {
    even = (word << 8) & 0xff00ff00u;
    odd = word & 0xff00ff00u;
  } else {
    const auto halves = [](uint32_t high_bytes) {
      const uint32_t magnitude = (high_bytes >> 1) & 0x3f803f80u;
      const uint32_t nan_exponent = (magnitude + 0x00800080u) & 0x40004000u;
      return (high_bytes & 0x80008000u) | magnitude | nan_exponent;
    };
    even = halves(word << 8);
    odd = halves(word);
  }
}

inline void fp8_word_to_float(float8_e5m2_bits, uint32_t word, float (&out)[4]) {
  uint32_t even, odd;
  fp8_word_halves<float8_e5m2_bits>(word, even, odd);
  halves_to_float(even, odd, out);
}

inline void fp8_word_to_float(float8_e4m3_bits, uint32_t word, float (&out)[4]) {
#if defined(IPEX_FLASH_CPU_LOOPS)
  // The carry's form (fp8_word_halves): fewer vector instructions a word, and a faster e4m3
  // decode on the CPU device (docs/api.md). GPUs' vector kernels keep the compares: with this
  // form their one-row decode grew to several times the instructions (docs/cpu_device.md;
  // gpu-check's record), unmeasured on hardware.
  uint32_t even, odd;
  fp8_word_halves<float8_e4m3_bits>(word, even, odd);
  halves_to_float(even, odd, out);
#else
  // Bytes 0 and 2 (even) and 1 and 3 (odd) in the low bytes of the two halves; the sign to a
  // half's bit 15, exponent and mantissa to bits 13..7.
  const auto fields = [](uint32_t bytes) {
    return ((bytes & 0x00800080u) << 8) | ((bytes & 0x007f007fu) << 7);
  };
  halves_to_float(fields(word & 0x00ff00ffu), fields((word >> 8) & 0x00ff00ffu), out);
#pragma unroll
  for (int u = 0; u < 4; ++u)  // S.1111.111, the only NaN, became +-1.875 (480 / 256)
    if (sycl::fabs(out[u]) == 1.875f) out[u] = sycl::bit_cast<float>(0x7fc00000u);
#endif
}

// Two 16-bit values in one 32-bit word, the first in the low half: the packed (VNNI) layout of
// the matrix engines' B operands (matrix/slm_tile.hpp).
template <typename T>
inline uint32_t pack_pair(T low, T high) {
  static_assert(sizeof(T) == 2, "16-bit types only");
  return static_cast<uint32_t>(sycl::bit_cast<uint16_t>(low)) |
         static_cast<uint32_t>(sycl::bit_cast<uint16_t>(high)) << 16;
}

}  // namespace ipex_flash
