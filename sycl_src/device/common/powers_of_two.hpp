// Integer helpers the packs' layouts share between the host (launchers) and the kernels.
#pragma once

#include <cstdint>

namespace ipex_flash {

// Whether x is a power of two (1, 2, 4, ...).
constexpr bool power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

// x rounded up to a multiple of unit (> 0).
constexpr int64_t round_up_to(int64_t x, int64_t unit) { return (x + unit - 1) / unit * unit; }

}  // namespace ipex_flash
