// Program entry: one module for the kernel compiler (one compiler run).
// The dropout keep-mask as a tensor, for tests: dropout_mask_kernel.
#pragma once

#include "probes/dropout_mask_kernel.hpp"
