// Program entry: one module for the kernel compiler (one compiler run).
// The matrix forward with its tiles staged in SLM and the K/V pack it reads:
// flash_fwd_pack_kv_kernel, flash_fwd_matrix_kernel.
#pragma once

#include "forward/pack_kv.hpp"
#include "forward/matrix_kernel.hpp"
