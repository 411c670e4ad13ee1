// Program entry: one module for the kernel compiler (one compiler run).
// The vector backward: flash_bwd_preprocess_kernel, flash_bwd_dkdv_kernel, flash_bwd_dq_kernel.
#pragma once

#include "backward/preprocess_kernel.hpp"
#include "backward/vector_kernels.hpp"
