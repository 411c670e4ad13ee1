#include "host/variants/decode_or_general.hpp"

#include <algorithm>
#include <string>

#include "host/runtime/device_queue.hpp"
#include "host/variants/decode_variant.hpp"
#include "host/variants/device_limits.hpp"

namespace ipex_flash {
namespace {

// Whether every row of a K/V cache (or page pool) of kv_bytes elements starts on a 4-byte
// boundary: its data pointer, and every stride but the contiguous last one, in whole 4-byte
// words.
bool word_aligned_rows(const TensorView& t, int kv_bytes) {
  if (t.data % 4 != 0) return false;
  for (size_t dim = 0; dim + 1 < t.strides.size(); ++dim)
    if (t.strides[dim] * kv_bytes % 4 != 0) return false;
  return true;
}

}  // namespace

bool decode_serves_rows(int64_t rows, int64_t new_tokens, int64_t heads_kv, SkipReasons* why) {
  if (rows <= kMaxDecodeRows || new_tokens <= max_sliced_decode_tokens(heads_kv)) return true;
  if (why)
    why->push_back(std::to_string(rows) + " query rows per K/V head (more than " +
                   std::to_string(kMaxDecodeRows) + ") with " + std::to_string(new_tokens) +
                   " new tokens (more than " + std::to_string(max_sliced_decode_tokens(heads_kv)) +
                   " with " + std::to_string(heads_kv) +
                   " K/V heads): the general forward kernel serves it, not the decode kernel's "
                   "row slices");
  return false;
}

bool flash_decode_supported(const TensorView& q, const TensorView& k, const TensorView& v,
                            std::uintptr_t queue_handle) {
  const int64_t heads_kv = k.size(1);
  if (heads_kv <= 0) return false;
  if (!decode_serves_rows((q.size(1) / heads_kv) * q.size(2), q.size(2), heads_kv)) return false;
  const DeviceLimits& limits = device_limits(queue_from_handle(queue_handle).get_device());
  if (kv_feature(k.dtype) != 0 && !limits.fp8_decode) return false;
  if (!decode_fits(q.dtype, static_cast<int>(std::max(q.size(3), v.size(3))),
                   static_cast<int>(std::min<int64_t>((q.size(1) / heads_kv) * q.size(2),
                                                      kMaxDecodeRows)),
                   kv_feature(k.dtype), limits))
    return false;
  // The decode kernel reads 16-bit and FP8 rows a 32-bit word at a time.
  const int kv_bytes = kv_element_bytes(k.dtype, kv_feature(k.dtype));
  return kv_bytes == 4 || (word_aligned_rows(k, kv_bytes) && word_aligned_rows(v, kv_bytes) &&
                           q.size(3) * kv_bytes % 4 == 0 && v.size(3) * kv_bytes % 4 == 0);
}

bool takes_decode_kernel(const TensorView& q, const TensorView& k, const TensorView& v,
                         const AttentionOptions& options, bool backward_follows,
                         std::uintptr_t queue_handle) {
  // A block of a larger attention (positions) measures ALiBi from global positions, which the
  // decode kernel does not read.
  return !options.dropout.enabled && !options.cu_seqlens_q && !options.positions &&
         !backward_follows &&
         flash_decode_supported(q, k, v, queue_handle);
}

}  // namespace ipex_flash
