// Whether a kernel runs on the device's matrix engine (joint_matrix: XMX on Intel GPUs, AMX on
// Xeons) and with which tile shape.
#pragma once

#include <string>

#include "host/device_limits.hpp"

namespace ipex_flash {

// IPEX_FLASH_MATRIX:
//   unset, "auto": on where the limits say it is verified (matrix_by_default: the CPU device
//                  with AMX), off elsewhere
//   "0": never;  "1": wherever the device takes the dtype in the kernels' shape (elsewhere the
//   vector kernels);  "8", "16": on, with that tile height (an error where it is not taken)
//   "emulate": the matrix kernels on any device, their joint_matrix calls replaced by
//   sub-group arithmetic of the same tile semantics (matrix_tile.hpp): a test vehicle for
//   their data flow where no matrix engine runs them, not a fast path
// Only 16-bit inputs use it.
struct MatrixTile {
  int m = 0;  // accumulator rows (MATRIX_M); 0: use the vector kernels
  int k = 0;  // reduction step (MATRIX_K): 32 where the engine takes it and the head dim allows
  bool emulated = false;  // built with IPEX_FLASH_MATRIX_EMULATE
};

// The kernels' B tiles are 16 columns wide (MATRIX_N), their sub-group 16 lanes: devices whose
// engine takes other widths only (DG2, Arrow Lake-H: N = 8 with sub-group 8) use the vector
// kernels.
constexpr int kMatrixN = 16;

// IPEX_FLASH_MATRIX's value, checked ("auto" when unset). Throws std::invalid_argument.
std::string matrix_mode();

// The tile for `dtype` at `head_dim` under `mode`. Throws std::runtime_error when a tile height
// is asked for ("8", "16") that the device does not take for that dtype.
MatrixTile matrix_tile(const DeviceLimits& limits, const std::string& dtype, int head_dim,
                       const std::string& mode);

}  // namespace ipex_flash
