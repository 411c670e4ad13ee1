// Program entry: one module for the kernel compiler (one compiler run).
// The check of a KV cache's lengths and pages on the device: cache_check_kernel.
#pragma once

#include "probes/cache_check_kernel.hpp"
