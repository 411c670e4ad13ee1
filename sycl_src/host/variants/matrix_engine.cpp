#include "host/variants/matrix_engine.hpp"

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

namespace {

std::string no_engine(const DeviceLimits& limits, const std::string& dtype) {
  if (limits.matrix.empty()) return limits.name + " has no matrix engine";
  return limits.name + "'s matrix engine takes no " + dtype +
         " tile of the kernels' shapes (N = 16 or 8, with a sub-group of N)";
}

}  // namespace

MatrixTile matrix_tile(const DeviceLimits& limits, const std::string& dtype, int head_dim,
                       const std::string& mode, SkipReasons* why) {
  if (mode == "0") {
    if (why) why->push_back("IPEX_FLASH_MATRIX=0 turns the matrix engine off");
    return {};
  }
  if (dtype == "float32") {  // float32 stays exact on the vector units
    if (why) why->push_back("float32 input: the matrix engine takes 16-bit inputs");
    return {};
  }
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
  if (!forced && !limits.matrix_by_default) {
    if (why)
      why->push_back(limits.matrix.empty()
                         ? no_engine(limits, dtype)
                         : "IPEX_FLASH_MATRIX=auto: the matrix engine is not verified on " +
                               limits.name + " (IPEX_FLASH_MATRIX=1 turns it on)");
    return {};
  }
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
  if (why) why->push_back(no_engine(limits, dtype));
  return {};
}

bool matrix_tiles_in_registers(const MatrixTile& tile, const DeviceLimits& limits, int head_dim,
                               int max_head_dim, int max_head_dim_8_wide, SkipReasons* why,
                               const char* form, const std::string& no_8_wide) {
  if (tile.m == 0) return false;  // (matrix_tile gave the reason)
  if (limits.matrix_layout_refused) {
    if (why) why->push_back(kLayoutRefused);
    return false;
  }
  const int most = tile.n == 8 ? max_head_dim_8_wide : max_head_dim;
  if (head_dim > most) {
    if (why) {
      const std::string engines = tile.n == 8 ? "on 8-wide matrix engines " : "";
      why->push_back(most == 0 ? no_8_wide
                               : "head dim " + std::to_string(head_dim) + " > " +
                                     std::to_string(most) + ": " + engines + form +
                                     " takes head dims up to " + std::to_string(most));
    }
    return false;
  }
  if (tile.emulated) return true;
  if (!limits.matrix_lane_columns) {
    if (why)
      why->push_back(limits.name + "'s matrix engine does not lay tiles out in lane columns " +
                     "(AMX): " + form + " needs XMX's layout");
    return false;
  }
  if (tile.n != 8 && !limits.large_grf) {
    if (why) why->push_back(limits.name + " has no 256-register file: " + form + " needs it");
    return false;
  }
  return true;
}

}  // namespace ipex_flash
