// A bool attn_mask packed a bit an element (MaskBitsParams), for the register kernels, forward
// and backward: there a lane tests a bit of a word it loads once per 32 keys
// (AttnMaskPlane::key_bits), where the mask read in place cost a 64-bit address, a byte gather
// and a bounds test an element, the most of features 7's main loops (softcap, ALiBi and a mask;
// gpu-check's record). One pass over the mask, before the kernels that read it; each of its
// planes (a broadcast dimension packs once) is read by every query head and key block after it.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "common/params.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// One work-item per word: (plane, row, word) flattened, planes (batch, head) as the mask
// broadcasts them (MaskBitsParams' batch, head 0). rows: the mask's (dims.len_q); words:
// MaskBitsParams::row.
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void flash_mask_bits_kernel(MaskBitsPackParams p) {
  const AttentionDims& dims = p.dims;
  const AttnMaskParams& m = p.mask;
  const MaskBitsParams& out = p.bits;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int64_t heads = m.head != 0 ? dims.heads_q : 1;
  const int64_t planes = (m.batch != 0 ? dims.batch : 1) * heads;
  const int64_t index = static_cast<int64_t>(item.get_global_id(0));
  if (index >= planes * dims.len_q * out.row) return;
  const int64_t word = index % out.row;
  const int64_t row = index / out.row % dims.len_q;
  const int64_t plane = index / out.row / dims.len_q;
  const int64_t b = plane / heads, h = plane % heads;
  const uint8_t* line = static_cast<const uint8_t*>(m.data) + b * m.batch + h * m.head +
                        row * m.row;
  uint32_t bits = 0;
  for (int i = 0; i < 32; ++i) {
    const int64_t key = word * 32 + i;
    if (key < dims.len_k && line[key * m.col] != 0) bits |= 1u << i;
  }
  out.words[b * out.batch + h * out.head + row * out.row + word] = bits;
}

}  // namespace ipex_flash
