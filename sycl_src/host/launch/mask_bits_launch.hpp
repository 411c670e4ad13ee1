// A bool attn_mask packed into bits (score/mask_bits_kernel.hpp) for the register kernels of
// both directions: where the bits go in a launch's scratch, and the packing launch.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "device/common/params.hpp"

namespace ipex_flash {

// The bytes of `mask`'s bits, a word per 32 keys (up to the end of the last block of block_n
// keys) of each row of each plane the mask does not broadcast; sets the word strides in `bits`.
// 0 without a mask.
int64_t mask_bits_layout(const AttentionDims& dims, int block_n, const AttnMaskParams& mask,
                         MaskBitsParams& bits);

// Where the bits start in a scratch whose first `used` bytes another pack holds: 64-byte
// aligned.
inline int64_t mask_bits_offset(int64_t used) { return (used + 63) / 64 * 64; }

// Packs `mask` into bits.words (laid out by mask_bits_layout), `bytes` of them, with the
// program's flash_mask_bits_kernel; the queue is in order, so before the next launch.
void pack_mask_bits(sycl::queue& queue, const sycl::kernel& kernel, const AttentionDims& dims,
                    const AttnMaskParams& mask, const MaskBitsParams& bits, int64_t bytes);

}  // namespace ipex_flash
