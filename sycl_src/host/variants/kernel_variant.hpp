// Kernel variants: what is fixed when a kernel is compiled (dtype, padded head dim, tile
// sizes, matrix-engine form), chosen per problem from the device's limits (device_limits.hpp)
// by each direction's policy (forward_variant.hpp, backward_variant.hpp, decode_variant.hpp),
// and the program (device header, kernel names, build options) that holds a variant's kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "host/variants/device_limits.hpp"

namespace ipex_flash {

struct KernelVariant {
  std::string dtype;  // "float32", "float16", "bfloat16"
  int head_dim;       // padded head dim the kernel is compiled for (>= the problem's D)
  int block_m;        // query rows per tile
  int block_n;        // keys per tile
  int features = 0;   // FEATURE_* bits (common/features.hpp): softcap, ALiBi, masks, ...
  int matrix_m = 0;   // matrix-engine kernels: tile height (matrix_engine.hpp); 0 otherwise
  int matrix_k = 0;   // and reduction step
  int matrix_n = 16;  // and width = sub-group size (16, or 8 on DG2 / Arrow Lake-H); 16 in the
                      // decode kernel's vector instantiation, which takes the argument anyway
  bool matrix_emulated = false;  // those kernels with sub-group arithmetic for joint_matrix
  // The forward's and dQ's tiles stay in registers (matrix_tiles_in_registers).
  bool matrix_registers = false;
  // The backward's dK/dV kernel's too (a narrower range of head dims than dQ's), and the
  // backward's packs in its layout (backward/pack_operands.hpp).
  bool dkdv_registers = false;
  // V's and O's padded head dim where the kernel is compiled for it apart from head_dim (the
  // forward's register kernel with D != Dv, MLA: 192 and 128); 0 where the kernels run both
  // at head_dim (the larger of D and Dv).
  int head_dim_v = 0;
  // The register forward's sub-groups per query row set, each with its share of V's head dim
  // (forward/registers_kernel.hpp: 2 on the 8-wide engines past head dim 64); its work-group
  // is block_m x value_split work-items. The decode kernel's register form: its sub-groups, each
  // with its share of O's columns (decode/xmx_kernel.hpp).
  int value_split = 1;
  // The vector forward's K and V tiles hold this many of their columns at a time, the head dims
  // walked in slabs (forward/vector_kernel.hpp, flash_fwd_slab_kernel), where whole rows do
  // not fit the device's local memory (past head dim 256 in 64 KiB, MLA's 576 / 512 in 128
  // KiB); 0: whole rows.
  int kv_cols = 0;
  size_t slm_bytes = 0;  // local memory the kernels need, as the launcher estimates it
  bool cpu_device = false;  // built for the SYCL CPU device: its loop forms (vector/tile_math.hpp)
  bool large_grf = false;   // Intel GPU kernels with 256 registers (common/kernel_props.hpp)

  // "kernel<T, HEAD_DIM, BLOCK_M, BLOCK_N, FEATURES>" for a kernel template with that
  // signature, with ", MATRIX_M, MATRIX_K, MATRIX_N" appended for the matrix-engine kernels.
  std::string instantiate(const std::string& kernel) const {
    return instantiate(kernel, matrix_m > 0);
  }
  // The same, with the matrix arguments always (matrix_args) or never appended: for a kernel
  // template that takes them whichever products it runs (the decode kernel; 0, 0, 16: vector).
  std::string instantiate(const std::string& kernel, bool matrix_args) const;
  // The head dim V and O are compiled at.
  int value_head_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // A pack kernel's order arguments (matrix/surface.hpp): ", MATRIX_M, MATRIX_K" where its
  // readers take their A tiles tile by tile (tiled: the 8-wide engines), ", 0, 0" row-major.
  std::string tile_order(bool tiled) const;
};

// a / b rounded up: blocks of b covering a.
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The device-code spelling of a dtype, for kernel template arguments. Throws
// std::invalid_argument for a dtype the kernels do not take.
std::string device_type_name(const std::string& dtype);

// A kernel's registered name (ending in '>') with more template arguments: `arguments` as
// written after the last one (", true, 8, 16"), or integers.
std::string with_trailing(const std::string& name, const std::string& arguments);
std::string with_trailing(const std::string& name, std::initializer_list<int> arguments);

// Kernels built together from one device header (one compiler run).
struct KernelProgram {
  std::string header;                // e.g. "programs/flash_fwd.hpp"
  std::vector<std::string> kernels;  // template instantiations, as registered_names
  std::vector<std::string> options;  // the kernel compiler's build options (program_options)
};

// The build options of a variant's program: the device's loop forms, register file, and
// matrix emulation (matrix/slm_tile.hpp).
std::vector<std::string> program_options(const KernelVariant& variant);

// The head dims the kernels are compiled for, the one statement of the rule (Python's checks
// read it: C.MAX_HEAD_DIM, C.MAX_QK_HEAD_DIM): v's (and so the output's) up to kMaxHeadDim; q's
// and k's up to kMaxQkHeadDim, past v's limit for DeepSeek's MLA, whose queries and keys are a
// 512-column latent and 64 rope columns and whose values the latent alone (576 / 512).
constexpr int kMaxHeadDim = 512;
constexpr int kMaxQkHeadDim = 576;

// The head dim kernels are compiled for: rounded up to a multiple of 16 up to 128, of 32 beyond
// (up to 576: 160, 192, ..., 320, ..., 448, 480, 512, 544, 576).
int padded_head_dim(int head_dim);

// The parts of a variant every kernel family shares: the validated dtype, the head dim rounded
// up to a compiled size, 64x64 tiles, and the device's code forms (loops, register file).
// Throws std::invalid_argument for head dims outside [1, kMaxQkHeadDim] (the kernels run q's
// and k's head dim, or the larger of it and v's) and unknown dtypes.
KernelVariant base_variant(const std::string& dtype, int head_dim, const DeviceLimits& limits);

// Bytes of local memory a kernel needs for (head_dim, block_m, block_n).
using SlmBytes = std::function<size_t(int head_dim, int block_m, int block_n)>;

// How far choose_variant may shrink a kernel's tiles, and what its error calls the kernel.
struct TileBounds {
  const char* kernel = "kernel";  // e.g. "backward kernel": "no backward kernel for head dim ..."
  int min_block_m = 16;  // one sub-group of rows (the vector forward's K/V slabs: 8)
  int max_block_n = 64;  // keys per block to start from (the K/V slabs: 16, one register chunk)
};

// The variant serving `head_dim`: head dim rounded up to a compiled size (multiples of 16 up
// to 128, of 32 beyond), 64x64 tiles shrunk until they fit the device's local memory and
// work-group limits. Throws std::invalid_argument for head dims outside [1, kMaxQkHeadDim], and
// std::runtime_error where even the smallest tiles do not fit, naming the kernel, the head dim,
// the device and the largest head dim its local memory fits.
KernelVariant choose_variant(const std::string& dtype, int head_dim, const DeviceLimits& limits,
                             const SlmBytes& slm_bytes, const TileBounds& bounds = {});

// The largest compiled head dim (padded_head_dim's sizes) at most `head_dim` whose smallest
// tiles (bounds) fit `local_bytes`; 0 where none does.
int largest_fitting_head_dim(int head_dim, size_t local_bytes, const SlmBytes& slm_bytes,
                             const TileBounds& bounds);

// "the <kernel> ... head dim D on <device>: its N KiB of local memory per work-group fits head
// dims up to M": the error of a kernel family no tiles of which fit the device.
std::string no_fit_message(const std::string& kernel, int head_dim, const DeviceLimits& limits,
                           size_t needed, int fits);

}  // namespace ipex_flash
