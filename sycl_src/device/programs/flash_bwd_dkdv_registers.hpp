// Program entry: one module for the kernel compiler (one compiler run).
// The matrix backward with both main kernels in registers: the preprocess, the packs (in the
// register layout), flash_bwd_dq_matrix_registers_kernel and
// flash_bwd_dkdv_matrix_registers_kernel, and the bool mask's packing into bits.
#pragma once

#include "backward/preprocess_kernel.hpp"
#include "score/mask_bits_kernel.hpp"
#include "backward/pack_operands.hpp"
#include "backward/matrix_kernels.hpp"
#include "backward/dq_registers_kernel.hpp"
#include "backward/dkdv_registers_kernel.hpp"
