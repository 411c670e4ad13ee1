// Program entry: one module for the kernel compiler (one compiler run).
// Decode against a KV cache: flash_decode_kernel (vector or matrix scores, with or without the
// append) or flash_decode_xmx_kernel (every product on the matrix engine, tiles in registers),
// and flash_decode_merge_kernel for split keys; flash_mask_bits_kernel packs a bool mask for
// the register form.
#pragma once

#include "decode/kernel.hpp"
#include "decode/merge_kernel.hpp"
#include "decode/xmx_kernel.hpp"
#include "score/mask_bits_kernel.hpp"
