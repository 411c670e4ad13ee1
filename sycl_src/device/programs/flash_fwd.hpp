// Program entry: one module for the kernel compiler (one compiler run).
// The vector forward (forward/vector_kernel.hpp): flash_fwd_kernel.
#pragma once

#include "forward/vector_kernel.hpp"
