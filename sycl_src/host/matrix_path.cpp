#include "host/matrix_path.hpp"

#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace ipex_flash {

std::string matrix_mode() {
  const char* env = std::getenv("IPEX_FLASH_MATRIX");
  const std::string mode = env == nullptr || *env == '\0' ? "auto" : env;
  if (mode != "auto" && mode != "0" && mode != "1" && mode != "8" && mode != "16" &&
      mode != "emulate" && mode != "emulate8")
    throw std::invalid_argument(
        "ipex_flash: IPEX_FLASH_MATRIX must be auto, 0, 1, 8, 16, emulate or emulate8, got '" +
        mode + "'");
  return mode;
}

MatrixTile matrix_tile(const DeviceLimits& limits, const std::string& dtype, int head_dim,
                       const std::string& mode) {
  if (mode == "0" || dtype == "float32") return {};  // float32 stays exact on the vector units
  // Emulated tiles need no engine, only the kernels' sub-group of N lanes. "emulate" runs
  // AMX's shape (the one that runs here on Xeons), so that emulation and AMX execute the same
  // tiling; "emulate8" DG2 / Arrow Lake-H's, so that the 8-lane kernels' data flow is tested.
  if (mode == "emulate" || mode == "emulate8") {
    const int n = mode == "emulate" ? 16 : 8;
    if (!limits.takes_sub_group(n))
      throw std::runtime_error("ipex_flash: IPEX_FLASH_MATRIX=" + mode + " but " + limits.name +
                               " has no sub-group of " + std::to_string(n));
    if (n == 8) return MatrixTile{8, 16, /*emulated=*/true, 8};
    return MatrixTile{16, head_dim % 32 == 0 ? 32 : 16, /*emulated=*/true, 16};
  }
  const bool forced = mode != "auto";
  if (!forced && !limits.matrix_by_default) return {};
  const std::vector<int> heights = mode == "8"    ? std::vector<int>{8}
                                   : mode == "16" ? std::vector<int>{16}
                                                  : std::vector<int>{16, 8};  // tallest first
  for (int n : kMatrixWidths) {
    if (!limits.takes_sub_group(n)) continue;
    for (int m : heights) {
      if (!limits.takes_matrix_tile(dtype, m, n, 16)) continue;
      // Deeper steps halve the tile loads and multiplies where the engine takes them (AMX).
      const bool deep = head_dim % 32 == 0 && limits.takes_matrix_tile(dtype, m, n, 32);
      return MatrixTile{m, deep ? 32 : 16, /*emulated=*/false, n};
    }
  }
  if (mode == "8" || mode == "16")  // a shape asked for by name; "1" falls back quietly
    throw std::runtime_error("ipex_flash: IPEX_FLASH_MATRIX=" + mode + " but " + limits.name +
                             " has no matrix engine for " + dtype + " tiles of that shape (" +
                             "the kernels need N = 16 or 8 with a sub-group of N)");
  return {};
}

bool matrix_tiles_in_registers(const MatrixTile& tile, const DeviceLimits& limits, int head_dim,
                               int max_head_dim, int max_head_dim_8_wide) {
  if (tile.m == 0 || limits.matrix_layout_refused) return false;
  if (tile.n == 8)
    return head_dim <= max_head_dim_8_wide && (tile.emulated || limits.matrix_lane_columns);
  if (head_dim > max_head_dim) return false;
  return tile.emulated || (limits.matrix_lane_columns && limits.large_grf);
}

}  // namespace ipex_flash
