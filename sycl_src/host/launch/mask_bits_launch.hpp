// A bool attn_mask packed into bits (score/mask_bits_kernel.hpp) for the register kernels of
// both directions: where the bits go in a launch's scratch, and the packing launch.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "device/common/params.hpp"

namespace ipex_flash {

// Where a launch's scratch puts a bool mask's bits: after the `used` bytes of its packs,
// 64-byte aligned, a word per 32 keys (up to the end of the last block of block_n keys) of each
// row of each plane the mask does not broadcast. Sets bits_offset and the word strides in
// `bits`; returns the scratch's whole size, `used` where the variant reads no bits (reads_bits
// false) or there is no mask.
struct MaskBitsScratch {
  int64_t bits_offset = 0;
  int64_t total = 0;
  int64_t bytes() const { return total - bits_offset; }
};
MaskBitsScratch mask_bits_scratch(int64_t used, bool reads_bits, const AttentionDims& dims,
                                  int block_n, const AttnMaskParams& mask, MaskBitsParams& bits);

// Points bits.words into the scratch at `scratch` and packs `mask` there (layout.bytes() > 0)
// with the program's flash_mask_bits_kernel; the queue is in order, so before the next launch.
void pack_mask_bits(sycl::queue& queue, const sycl::kernel& kernel, const AttentionDims& dims,
                    const AttnMaskParams& mask, const MaskBitsScratch& layout,
                    std::uintptr_t scratch, MaskBitsParams& bits);

}  // namespace ipex_flash
