// Program entry: one module for the kernel compiler (one compiler run).
// The matrix forward with its tiles in registers and the K/V pack it reads:
// flash_fwd_pack_kv_kernel, flash_fwd_matrix_registers_kernel, and the bool mask's packing
// into bits.
#pragma once

#include "forward/pack_kv.hpp"
#include "score/mask_bits_kernel.hpp"
#include "forward/registers_kernel.hpp"
