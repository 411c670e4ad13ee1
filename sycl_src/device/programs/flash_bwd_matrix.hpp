// Program entry: one module for the kernel compiler (one compiler run).
// The matrix backward with its tiles staged in SLM: the preprocess, the two packs of its operands,
// flash_bwd_dkdv_matrix_kernel and flash_bwd_dq_matrix_kernel.
#pragma once

#include "backward/preprocess_kernel.hpp"
#include "backward/pack_operands.hpp"
#include "backward/matrix_kernels.hpp"
