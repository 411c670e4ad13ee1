// Program entry: one module for the kernel compiler (one compiler run).
// flash_attn_with_kvcache's append of new keys and values into the cache: kv_append_kernel and
// kv_append_rotary_kernel.
#pragma once

#include "kvcache/append_kernels.hpp"
