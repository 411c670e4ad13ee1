// What variant selection needs to know of a device, as data: read from a sycl::device, or
// taken from a named Intel GPU profile (gpu_profiles.cpp), so that one code path chooses
// tiles, matrix shapes and register modes for the device a call runs on and for GPUs this
// machine does not have (python -m ipex_flash plan and gpu-check, and the tests that run a
// GPU's variants on the CPU device).
#pragma once

#include <sycl/sycl.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace ipex_flash {

// One entry of the device's matrix_combinations for 16-bit inputs and float32 accumulators.
// A dimension is either fixed (m, n, k > 0) or bounded (0, with the bound in max_*): Xe-HPC and
// Xe2 report M <= 8 as m = 0, max_m = 8 next to fixed n = 16, k = 16; AMX bounds all three.
struct MatrixShape {
  std::string dtype;  // "bfloat16" or "float16"
  int m = 0, n = 0, k = 0;
  int max_m = 0, max_n = 0, max_k = 0;
  bool takes(int tile_m, int tile_n, int tile_k) const;
};

struct DeviceLimits {
  std::string name;          // profile name ("bmg") or the device's name
  std::string title;         // a profile's GPU in words ("Meteor Lake"), for errors; "" otherwise
  std::string ocloc_device;  // ocloc's -device for a GPU profile; "" for a real device
  bool is_cpu = false;
  size_t local_mem_bytes = 0;     // per work-group
  size_t max_work_group = 0;      // work-items
  std::vector<int> sub_group_sizes;
  int compute_units = 1;
  // A GPU profile's published figures for the part it names (0 elsewhere): its graphics clock,
  // the lanes each vector engine's ALU takes per clock (8 on Xe-LPG/HPG, 16 on Xe2 and
  // Xe-HPC), and its memory bandwidth. With compute_units they say how many instructions the
  // GPU can issue per KiB its memory delivers (ipex_flash/tools/gpu_bandwidth.py).
  int clock_mhz = 0;
  int vector_lanes = 0;
  double memory_gb_per_s = 0;
  std::vector<MatrixShape> matrix;  // empty: no matrix engine this build can use
  bool matrix_by_default = false;   // IPEX_FLASH_MATRIX=auto turns the matrix kernels on
  bool large_grf = false;           // 256-register mode exists (PVC, BMG, LNL)
  // The decode kernel serves FP8 caches: the CPU device, and GPUs with the large register file
  // (flash_decode_supported, fwd_variant). Kept by a profile on the CPU device, which drops
  // large_grf.
  bool fp8_decode = false;
  // Its compiler builds the matrix backward with an attention mask. Not the OpenCL CPU
  // compiler (2026.0-2026.1, AMX targets): LLVM's "Lower AMX type for load/store" crashed the
  // process building the dK/dV and dQ matrix kernels together, and the dQ kernel built apart
  // computed wrong gradients. There such calls take the vector backward.
  bool matrix_masked_backward = true;
  // The matrix engine lays a sub-group's tiles out in lane columns (matrix/registers.hpp), so
  // that the forward and dQ can keep their tiles in registers (where there are enough of them,
  // matrix_tiles_in_registers): XMX on every Intel GPU. Not AMX, whose tiles take the
  // SLM-staged forward (forward/matrix_kernel.hpp). A profile on the CPU device takes the CPU's.
  bool matrix_lane_columns = false;
  // Set on a copy of the limits where the layout probe failed (matrix_layout_probe.hpp): the
  // matrix kernels then stage their tiles through SLM.
  bool matrix_layout_refused = false;

  bool takes_matrix_tile(const std::string& dtype, int m, int n, int k) const;
  bool takes_sub_group(int size) const;
};

// The limits variant selection uses for `device` (cached per device). On the SYCL CPU device
// a profile set with set_device_profile replaces them, so the CPU runs the variants that GPU
// would; the matrix shapes are then the profile's where the CPU's AMX also takes them.
const DeviceLimits& device_limits(const sycl::device& device);

// The limits of a named Intel GPU: pvc, bmg, dg2, lnl, mtl, arl-h. Throws std::invalid_argument
// for other names.
DeviceLimits profile_limits(const std::string& name);
std::vector<std::string> profile_names();

// "" restores the CPU device's own limits.
void set_device_profile(const std::string& name);

// Set once by the Python package: true when the SYCL CPU device compiles for an AMX target
// (the OpenCL CPU runtime does not detect it on every Xeon; ipex_flash/_runtime.py sets
// CL_CONFIG_CPU_TARGET_ARCH). Without it the CPU backend cannot lower joint_matrix.
void set_cpu_matrix_engine(bool available);

}  // namespace ipex_flash
