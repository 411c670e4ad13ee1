#include "host/launch/mask_bits_launch.hpp"

#include <stdexcept>
#include <string>

#include "host/launch/attention_options.hpp"
#include "host/launch/submit.hpp"
#include "host/variants/kernel_variant.hpp"

namespace ipex_flash {
namespace {

constexpr int kWordsPerGroup = 64;

}  // namespace

MaskBitsScratch mask_bits_scratch(int64_t used, bool reads_bits, const AttentionDims& dims,
                                  int block_n, const AttnMaskParams& mask, MaskBitsParams& bits) {
  if (!reads_bits || mask.data == nullptr) return {used, used};
  bits.row = mask_bits_words(dims.len_k, block_n);
  if (dims.len_q * bits.row > INT32_MAX)  // the kernels index a plane in 32 bits
    throw std::invalid_argument(
        "ipex_flash: a bool attn_mask's plane of " + std::to_string(dims.len_q) + " x " +
        std::to_string(dims.len_k) + " exceeds the register kernels' 2^36 elements");
  bits.head = mask.head != 0 ? dims.len_q * bits.row : 0;
  const int64_t heads = mask.head != 0 ? dims.heads_q : 1;
  bits.batch = mask.batch != 0 ? heads * dims.len_q * bits.row : 0;
  const int64_t batches = mask.batch != 0 ? dims.batch : 1;
  const int64_t offset = (used + 63) / 64 * 64;
  return {offset, offset + batches * heads * dims.len_q * bits.row * 4};
}

void pack_mask_bits(sycl::queue& queue, const sycl::kernel& kernel, const AttentionDims& dims,
                    const AttnMaskParams& mask, const MaskBitsScratch& layout,
                    std::uintptr_t scratch, MaskBitsParams& bits) {
  bits.words = reinterpret_cast<uint32_t*>(scratch + layout.bits_offset);
  const MaskBitsPackParams params{dims, mask, bits};
  submit_kernel(queue, kernel, params,
                block_range(1, ceil_div(layout.bytes() / 4, kWordsPerGroup), kWordsPerGroup),
                "flash_mask_bits");
}

}  // namespace ipex_flash
