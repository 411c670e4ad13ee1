// Whether a forward call runs on the device's matrix engine (flash_fwd_matrix.hpp: XMX on
// Intel GPUs, AMX on Xeons) and with which tile height.
#pragma once

#include <sycl/sycl.hpp>

#include <string>

namespace ipex_flash {

// IPEX_FLASH_MATRIX (read on every call):
//   unset, "auto": on where it is tested (the CPU device with AMX enabled), off elsewhere
//   "0": never;  "1": wherever the device takes the dtype;  "8", "16": on, with that tile height
// Only 16-bit inputs use it.
struct MatrixTile {
  int m = 0;  // accumulator rows (MATRIX_M); 0: use the vector kernels
  int k = 0;  // reduction step (MATRIX_K): 32 where the engine takes it and the head dim allows
};
// Throws std::runtime_error when the path is forced on for a device without a matrix engine
// for the dtype.
MatrixTile matrix_tile(const sycl::device& device, const std::string& dtype, int head_dim);

// Set once by the Python package: true when the SYCL CPU device compiles for an AMX target
// (the OpenCL CPU runtime does not detect it on every Xeon; ipex_flash/_runtime.py sets
// CL_CONFIG_CPU_TARGET_ARCH). Without it the CPU backend cannot lower joint_matrix.
void set_cpu_matrix_engine(bool available);

// The device has a matrix engine this build can use (on the CPU device: AMX enabled, above).
bool has_matrix_engine(const sycl::device& device);

}  // namespace ipex_flash
