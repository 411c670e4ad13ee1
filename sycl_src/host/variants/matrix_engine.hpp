// Whether a kernel runs on the device's matrix engine (joint_matrix: XMX on Intel GPUs, AMX on
// Xeons), with which tile shape, and whether its tiles may stay in registers: the choices every
// direction's policy (forward_variant, backward_variant, decode_variant) starts from.
#pragma once

#include <string>

#include "host/variants/device_limits.hpp"
#include "host/variants/skip_reasons.hpp"

namespace ipex_flash {

// IPEX_FLASH_MATRIX:
//   unset, "auto": on where the limits say it is verified (matrix_by_default: the CPU device
//                  with AMX), off elsewhere
//   "0": never;  "1": wherever the device takes the dtype in the kernels' shape (elsewhere the
//   vector kernels);  "8", "16": on, with that tile height (an error where it is not taken)
//   "emulate": the matrix kernels on any device, their joint_matrix calls replaced by
//   sub-group arithmetic of the same tile semantics (matrix/slm_tile.hpp): a test vehicle for
//   their data flow where no matrix engine runs them, not a fast path; AMX's tile shape
//   (N = 16), with the forward as 256-register GPUs run it (tiles in registers)
//   "emulate8": the same with DG2 / Arrow Lake-H's XMX shape (N = 8, sub-group 8, M = 8, K = 16)
//   and their SLM-staged forward
// Only 16-bit inputs use it.
struct MatrixTile {
  int m = 0;  // accumulator rows (MATRIX_M); 0: use the vector kernels
  int k = 0;  // reduction step (MATRIX_K): 32 where the engine takes it and the head dim allows
  bool emulated = false;  // built with IPEX_FLASH_MATRIX_EMULATE
  int n = 16;  // accumulator columns = sub-group size (MATRIX_N)
};

// The widths (MATRIX_N, each with a sub-group of that size) the kernels are built for, widest
// first: 16 where the engine takes it (AMX, Xe-HPC, Xe2), else 8 (DG2, Arrow Lake-H, whose
// XMX takes only sub-group 8, N = 8).
constexpr int kMatrixWidths[] = {16, 8};

// IPEX_FLASH_MATRIX's value, checked ("auto" when unset). Throws std::invalid_argument.
std::string matrix_mode();

// The tile for `dtype` at `head_dim` under `mode`. Throws std::runtime_error when a tile height
// is asked for ("8", "16") that the device does not take for that dtype, or an emulated shape
// whose sub-group the device lacks. why: where it gives no tile (the vector kernels), the reason.
MatrixTile matrix_tile(const DeviceLimits& limits, const std::string& dtype, int head_dim,
                       const std::string& mode, SkipReasons* why = nullptr);

// Whether the matrix kernels keep their tiles in registers (forward/registers_kernel.hpp,
// backward/dq_registers_kernel.hpp): engines with the lane-column layout and 256 registers per
// thread (PVC, BMG, Lunar Lake; the forward's output accumulator alone takes 128 of them at
// d = 128), and the emulation at sub-group 16, up to max_head_dim: the resident accumulator
// takes HEAD_DIM / 8 x 8 registers (the forward's output and dQ: 128, dQ's score tiles 16 keys
// at a time beside it; dK/dV: 64, its two accumulators would fill the 256 registers at 128).
// The 8-wide engines (DG2, Arrow Lake-H: 128 registers of 32 bytes, a sub-group's 8 rows) and
// emulate8 up to max_head_dim_8_wide: the forward's O^T takes 64 registers at d = 64 and all
// 128 at d = 128, where it would spill (gpu-check's record, docs/gpus.md), so past 64 the
// forward splits it between two sub-groups (KernelVariant::value_split); 0 where a kernel has
// no 8-wide register form. Elsewhere the SLM-staged kernels: AMX always.
// why: where a tile is given but not kept in registers, the reason, naming the kernel's register
// form as `form` ("the register forward"); with max_head_dim_8_wide = 0, `no_8_wide` is the
// reason on an 8-wide engine.
bool matrix_tiles_in_registers(const MatrixTile& tile, const DeviceLimits& limits, int head_dim,
                               int max_head_dim, int max_head_dim_8_wide = 0,
                               SkipReasons* why = nullptr, const char* form = "",
                               const std::string& no_8_wide = std::string());

}  // namespace ipex_flash
