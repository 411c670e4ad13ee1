// The compile-time feature bits of a kernel variant (its FEATURES template argument).
// Shared verbatim by the host launchers (g++) and the device code (compiled at run time by the
// kernel compiler). Plain C++ only: no SYCL types here.
#pragma once

#include <cstdint>

namespace ipex_flash {

// Compile-time feature bits of a kernel variant (the FEATURES template argument): code for a
// score change that a call does not use is not compiled in.
constexpr int FEATURE_SOFTCAP = 1;
constexpr int FEATURE_ALIBI = 2;
// A user's attention mask (score/tensor_mask.hpp), one bit per element type: bool (false hides the
// key) or an additive float32 / float16 / bfloat16 bias.
constexpr int FEATURE_MASK_BOOL = 4;
constexpr int FEATURE_MASK_F32 = 8;
constexpr int FEATURE_MASK_F16 = 16;
constexpr int FEATURE_MASK_BF16 = 32;
constexpr int FEATURE_ATTN_MASK =
    FEATURE_MASK_BOOL | FEATURE_MASK_F32 | FEATURE_MASK_F16 | FEATURE_MASK_BF16;
constexpr int FEATURE_FLOAT_MASK = FEATURE_ATTN_MASK & ~FEATURE_MASK_BOOL;  // read in place
// Softcap beside ALiBi or a user's mask. The kernels without a tanh form of their own take
// sycl::tanh there, not the short form (score/softcap_alibi.hpp: beside the other score changes
// IGC's schedule of it spilled), and the 8-wide engines keep their SLM-staged kernels beside a
// float mask past d = 64 (softcap_beside_wide_float_mask): host and device read these rules, so
// a plan cannot drift from the tanh its kernel compiles. (The register forward takes the fused
// tanh, on every engine.)
constexpr bool softcap_beside_score_changes(int features) {
  return (features & FEATURE_SOFTCAP) != 0 &&
         (features & (FEATURE_ALIBI | FEATURE_ATTN_MASK)) != 0;
}
// A float mask past head dim 64, read in place: there the register forward (every engine) and
// the 8-wide register dK/dV keep one loop over their blocks, where split they spilled
// (forward/registers_kernel.hpp, score/block_mask.hpp).
constexpr bool wide_float_mask(int head_dim, int features) {
  return head_dim > 64 && (features & FEATURE_FLOAT_MASK) != 0;
}
// Softcap beside it: there the 8-wide engines keep the SLM-staged forward and dK/dV
// (host/variants/forward_variant.cpp, backward_variant.cpp).
constexpr bool softcap_beside_wide_float_mask(int head_dim, int features) {
  return softcap_beside_score_changes(features) && wide_float_mask(head_dim, features);
}
// An FP8 KV cache (common/kv_quant.hpp): K and V in float8_e4m3fn or float8_e5m2, q and out in T.
constexpr int FEATURE_KV_E4M3 = 64;
constexpr int FEATURE_KV_E5M2 = 128;
constexpr int FEATURE_KV_FP8 = FEATURE_KV_E4M3 | FEATURE_KV_E5M2;
// The decode kernel for V's head dim != Q's (dims.head_dim_v); without it the kernel treats
// them as one, which keeps its fp32 form within DG2's 128 registers (gpu-check).
constexpr int FEATURE_VALUE_DIM = 256;
// The decode kernel on the CPU device reads its keys as streams (decode/key_streams.hpp); set by
// the host for caches whose key rows hold the heads side by side.
constexpr int FEATURE_KEY_STREAMS = 512;
// The decode kernel first writes flash_attn_with_kvcache's new keys and values into the cache
// (decode/append.hpp, DecodeParams::append): a decode step that appends is one launch.
constexpr int FEATURE_APPEND = 1024;
// With FEATURE_APPEND, the rotary embedding of the new keys and of the queries
// (kvcache/rotary.hpp), its tables in float32 or in the queries' dtype.
constexpr int FEATURE_ROTARY_F32 = 2048;
constexpr int FEATURE_ROTARY_INPUT = 4096;
constexpr int FEATURE_ROTARY = FEATURE_ROTARY_F32 | FEATURE_ROTARY_INPUT;
// The call is a block of a larger attention (GlobalPositions): dropout reads where it sits.
// Compiled in only then: the table's reads and the keys off the four-key groups, in every
// kernel's dropout path, made the register forward with every score change spill 832-960
// bytes on BMG and PVC (448-576 without them).
constexpr int FEATURE_PLACED = 8192;

}  // namespace ipex_flash
