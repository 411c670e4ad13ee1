// Program entry: one module for the kernel compiler (one compiler run).
// The check of the matrix engine's tile layout before the register kernels run:
// matrix_layout_probe_kernel.
#pragma once

#include "probes/matrix_layout_probe_kernel.hpp"
