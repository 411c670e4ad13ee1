// Program entry: one module for the kernel compiler (one compiler run).
// The vector forward (forward/vector_kernel.hpp): flash_fwd_kernel, and flash_fwd_slab_kernel for
// head dims whose whole K/V rows outgrow the device's local memory.
#pragma once

#include "forward/vector_kernel.hpp"
