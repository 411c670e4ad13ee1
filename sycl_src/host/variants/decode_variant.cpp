#include "host/variants/decode_variant.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "host/variants/matrix_engine.hpp"

namespace ipex_flash {
namespace {

constexpr int kMinKeysPerSplit = 256;  // below this a split costs more to merge than it saves
// Keys per online-softmax update (BLOCK_N): as many as make one K/V head's rows of a block
// about 8 KB (16 fp32 rows of d = 128, 32 bf16 ones), within [kMinDecodeBlockKeys,
// kMaxDecodeBlockKeys] and a power of two (a multiple of the matrix tile's 16 rows). The work
// paid once per block (lane reductions of the softmax, the score tile, barriers) then costs the
// same per byte read for every dtype and head dim, and a block's K and V rows stay in L1
// between the scores and P.V. Measured on the 2-core CPU device: bf16 d = 128 0.58 -> 0.66x the
// speed of a copy with 32 keys instead of 16; fp32 d = 128 loses with 64, bf16 d = 64 gains
// with 64.
constexpr int kDecodeBlockBytes = 8192;

int decode_block_keys(int kv_bytes, int head_dim) {
  const int row_bytes = head_dim * kv_bytes;
  int keys = kMinDecodeBlockKeys;
  while (keys < kMaxDecodeBlockKeys && 2 * keys * row_bytes <= kDecodeBlockBytes) keys *= 2;
  return keys;
}

// The head dim the decode kernel is compiled for: K/V rows are read a 32-bit word per lane
// (RowVectors), 4 / kv_bytes columns, so whole loads of 16 lanes.
int decode_head_dim(int kv_bytes, int padded_head_dim) {
  const int64_t columns = DECODE_LANES * 4 / kv_bytes;
  return static_cast<int>(ceil_div(padded_head_dim, columns) * columns);
}

// The query rows of one K/V head (of a slice of them) rounded up to a power of two: the
// kernel's GROUP_ROWS.
int decode_group_rows(int rows) {
  int group_rows = 1;
  while (group_rows < std::min(rows, kMaxDecodeRows)) group_rows *= 2;
  return group_rows;
}

// Bytes of local memory the decode kernel declares (decode/kernel.hpp, its work_group_static
// arrays) for a compiled head dim, GROUP_ROWS, BLOCK_N and element size, built for the CPU
// device or not (decode_row_capacity); the matrix-score buffers only when `matrix`, every
// head's probabilities only when `step_major` (the CPU device's vector scores,
// DECODE_STEP_MAJOR), every head's factors only with `key_streams`.
size_t decode_slm_bytes(int head_dim, int group_rows, int block_n, size_t elem_bytes,
                        bool cpu_device, bool matrix, bool step_major, bool key_streams) {
  const size_t d = head_dim, lanes = DECODE_LANES, keys = block_n;
  const size_t max_heads = decode_row_capacity(head_dim, cpu_device) / group_rows;
  const size_t sets = ceil_div(max_heads, lanes / group_rows);
  const size_t floats = 2 * max_heads * group_rows * d  // Q and O
                        + 2 * max_heads * lanes         // running max and sum
                        + (step_major ? max_heads : 1) * keys * group_rows  // probabilities
                        + (key_streams ? max_heads : 1) * lanes;  // per-row factors
  const size_t matrix_bytes = matrix ? sizeof(uint32_t) * sets * (d / 2) * lanes  // Q^T packed
                                           + sizeof(float) * keys * lanes         // S^T
                                           + elem_bytes * keys * d                // staged K
                                     : sizeof(uint32_t) + sizeof(float) + elem_bytes;
  return sizeof(float) * floats + matrix_bytes;
}

// Whether the decode kernel reads its keys as streams (decode/key_streams.hpp): on the CPU device
// (its vector scores, step-major), with at least 4 keys per step (at most 4 query rows per K/V
// head), for a cache whose key rows hold the heads side by side. Measured on the CPU device:
// with 8 rows per head, or a (B, H, N, D) cache, the consecutive order is faster.
bool decode_key_streams(const KernelVariant& variant, bool heads_interleaved) {
  return variant.cpu_device && variant.matrix_m == 0 && heads_interleaved &&
         DECODE_LANES / variant.block_m >= 4;
}

// The vector-score variant's local memory (decode_slm_bytes) for a call: what the kernel needs
// at least, whatever its scores.
size_t decode_vector_slm_bytes(const std::string& dtype, int head_dim, int rows, int features,
                               const DeviceLimits& limits) {
  const int kv_bytes = kv_element_bytes(dtype, features);
  const int d = decode_head_dim(kv_bytes, padded_head_dim(head_dim));
  return decode_slm_bytes(d, decode_group_rows(rows), decode_block_keys(kv_bytes, d),
                          dtype == "float32" ? 4 : 2, limits.is_cpu, false, limits.is_cpu, false);
}

// The matrix-engine form with every tile in registers (decode/xmx_kernel.hpp), where it serves
// the call: 16-bit queries on an engine of 16-wide tiles in lane columns with 256 registers (XMX
// on PVC, BMG, Lunar Lake; or its emulation), 8x16x16 tiles; head dims of whole tiles (multiples
// of 16) up to MLA's 576 for Q and K and 512 for V (head_dim_v; 0: head_dim), every score change
// (softcap, ALiBi, a user's mask), the append and its rotary embedding, FP8 caches up to 8 rows
// (converted to half in registers: decode/xmx_tiles.hpp). O's
// accumulators take ROWS x Dv / 16 registers: past 64, sub-groups share the work-group
// (value_split), each with its share of O's columns and of a block's keys for S. Sets the
// variant's tile, rows, key block and sub-groups and returns true; false (with the reason) where
// the other forms serve.
bool take_xmx_form(KernelVariant& variant, int head_dim, int head_dim_v, int rows, int kv_bytes,
                   const MatrixTile& tile, const DeviceLimits& limits, SkipReasons* why) {
  constexpr int kTile = 16, kTileRows = 8, kORegisters = 64, kRegisterFloats = 16;
  const int served = FEATURE_SOFTCAP | FEATURE_ALIBI | FEATURE_ATTN_MASK | FEATURE_APPEND |
                     FEATURE_ROTARY | FEATURE_VALUE_DIM | FEATURE_KV_FP8;
  if (kv_bytes > 2 || tile.n != kTile ||
      !matrix_tiles_in_registers(tile, limits, head_dim, kMaxQkHeadDim, 0, why,
                                 "the decode kernel's register form"))
    return false;
  const bool value_dim = (variant.features & FEATURE_VALUE_DIM) != 0;
  const int dv = value_dim ? head_dim_v : head_dim;
  const int block_m = rows > kTileRows ? 2 * kTileRows : kTileRows;
  int subgroups = 1;
  while (block_m * dv / kRegisterFloats / subgroups > kORegisters) subgroups *= 2;
  std::string reason;
  const std::string tile_dtype = kv_bytes == 1 ? "float16" : variant.dtype;  // FP8: half tiles
  if (!tile.emulated && !limits.takes_matrix_tile(tile_dtype, kTileRows, kTile, kTile))
    reason = limits.name + " takes no " + tile_dtype + " tiles of 8x16x16";
  else if (kv_bytes == 1 && block_m > kTileRows)
    reason = "FP8 cache with " + std::to_string(rows) + " rows per K/V head: the 16-row form "
             "spills 1-14 KB beside the conversions (gpu-check; 8 rows do not)";
  else if ((variant.features & ~served) != 0)
    reason = "feature bits " + std::to_string(variant.features & ~served) + " are not its";
  else if (head_dim % kTile != 0 || dv % kTile != 0)
    reason = "head dim " + std::to_string(head_dim) + (value_dim ? "/" + std::to_string(dv) : "") +
             " is not a multiple of 16";
  else if (dv <= 0 || dv > kMaxHeadDim || (value_dim && dv >= head_dim))
    reason = "value head dim " + std::to_string(dv) + " not in [16, " +
             std::to_string(value_dim ? std::min(head_dim - kTile, kMaxHeadDim) : kMaxHeadDim) +
             "] (V's head dim past Q's takes the vector form)";
  else if (dv % (kTile * subgroups) != 0)
    reason = "value head dim " + std::to_string(dv) + " does not split into whole tiles over " +
             std::to_string(subgroups) + " sub-groups";
  if (!reason.empty()) {
    if (why) why->push_back("decode kernel's register form: " + reason);
    return false;
  }
  variant.head_dim = head_dim;
  variant.head_dim_v = dv;
  variant.value_split = subgroups;
  variant.block_m = block_m;
  // S beside O and Q; with several sub-groups two key tiles each (Q's A tiles, read from SLM
  // per block, then serve two tiles of keys: MLA's 16-row decode issued 1.4x the instructions
  // per KiB with one)
  variant.block_n = subgroups > 1 ? 2 * kTile * subgroups : block_m * head_dim <= 1024 ? 64 : 32;
  variant.matrix_m = kTileRows;
  variant.matrix_k = kTile;
  variant.matrix_n = kTile;
  variant.matrix_emulated = tile.emulated;
  variant.matrix_registers = true;
  // Q as T, in the same bytes O's row tile as float; a block's P as T; the sub-groups' maxima
  // and sums, the rows' scales, and with an FP8 cache Q's rows' units (decode/xmx_kernel.hpp)
  variant.slm_bytes = std::max<size_t>(2 * block_m * head_dim, 4 * kTileRows * dv) +
                      2 * block_m * variant.block_n +
                      4 * block_m * (subgroups + (kv_bytes == 1 ? 2 : 1));
  return true;
}

}  // namespace

bool decode_fits(const std::string& dtype, int head_dim, int rows, int features,
                 const DeviceLimits& limits, SkipReasons* why) {
  const size_t needed = decode_vector_slm_bytes(dtype, head_dim, rows, features, limits);
  if (needed <= limits.local_mem_bytes) return true;
  if (why)
    why->push_back("head dim " + std::to_string(head_dim) + ": the decode kernel needs " +
                   std::to_string(needed) + " bytes of local memory (Q and O of its query rows " +
                   "in float32), " + limits.name + " has " +
                   std::to_string(limits.local_mem_bytes) +
                   ": the general forward kernel serves it");
  return false;
}

int kv_element_bytes(const std::string& dtype, int features) {
  return (features & FEATURE_KV_FP8) != 0 ? 1 : dtype == "float32" ? 4 : 2;
}

// One work-group of kMaxDecodeRows work-items (one sub-group; the register form's, value_split
// of them) per (batch, group of K/V heads, split); the kernel is specialised on the rows rounded
// up to a power of two, which sizes its P.V accumulators. Scores go to the matrix engine where
// the forward would use it and the local memory holds its buffers.
KernelVariant decode_variant(const std::string& dtype, int head_dim, int rows, int features,
                             bool heads_interleaved, const DeviceLimits& limits,
                             const std::string& mode, SkipReasons* why, int head_dim_v) {
  const int kv_bytes = kv_element_bytes(dtype, features);
  KernelVariant variant = base_variant(dtype, head_dim, limits);
  variant.head_dim = decode_head_dim(kv_bytes, variant.head_dim);
  variant.block_m = decode_group_rows(rows);
  variant.block_n = decode_block_keys(kv_bytes, variant.head_dim);
  variant.features = features;
  const size_t elem_bytes = dtype == "float32" ? 4 : 2;
  if (kv_bytes == 1 && !limits.fp8_decode)
    throw std::invalid_argument("ipex_flash: FP8 caches on " + limits.name +
                                " run the general kernel (flash_decode_supported)");
  // (an FP8 cache under a tile shape asked for by name, IPEX_FLASH_MATRIX=8 or 16, keeps the
  // vector form, as before the register form took FP8: such a shape is an error for the
  // engine's missing dtypes, which FP8 decodes never asked it for)
  const MatrixTile engine_tile =
      kv_bytes == 1 && (mode == "8" || mode == "16")
          ? MatrixTile{}
          : matrix_tile(limits, dtype, variant.head_dim, mode, why);
  if (take_xmx_form(variant, head_dim, head_dim_v, rows, kv_bytes, engine_tile, limits, why))
    return variant;
  // FP8 caches (common/kv_quant.hpp) outside the register form compute their scores on the
  // vector units.
  if (kv_bytes == 1 && why)
    why->push_back("FP8 cache: the decode kernel's vector form computes FP8 scores on the "
                   "vector units");
  const MatrixTile tile = kv_bytes == 1 ? MatrixTile{} : engine_tile;
  const size_t matrix_slm =
      decode_slm_bytes(variant.head_dim, variant.block_m, variant.block_n, elem_bytes,
                       variant.cpu_device, true, false, false);
  // The scores' tile is as wide as the kernel's sub-group (DECODE_LANES): N = 8 engines (DG2,
  // Arrow Lake-H) compute decode scores on the vector units.
  if (tile.m > 0 && tile.n == DECODE_LANES && matrix_slm <= limits.local_mem_bytes) {
    variant.matrix_m = tile.m;
    variant.matrix_k = tile.k;
    variant.matrix_emulated = tile.emulated;
  } else if (tile.m > 0 && why) {
    why->push_back(tile.n != DECODE_LANES
                       ? "8-wide matrix engine: the decode kernel's matrix scores need tiles " +
                             std::to_string(DECODE_LANES) + " wide, its sub-group's width"
                       : "the decode kernel's matrix scores need " + std::to_string(matrix_slm) +
                             " bytes of local memory, " + limits.name + " has " +
                             std::to_string(limits.local_mem_bytes));
  }
  // (key streams keep every head's factors in SLM: only where they fit)
  const bool key_streams =
      decode_key_streams(variant, heads_interleaved) &&
      decode_slm_bytes(variant.head_dim, variant.block_m, kMaxDecodeBlockKeys, elem_bytes,
                       variant.cpu_device, variant.matrix_m > 0,
                       variant.cpu_device && variant.matrix_m == 0, true) <= limits.local_mem_bytes;
  if (key_streams) {
    variant.features |= FEATURE_KEY_STREAMS;
    // The most keys per block: V is read in a pass of its own, so a block's rows need not stay
    // in L1, and the softmax and barriers come less often (CPU device: bf16 12.0 -> 11.2 ms,
    // fp32 18.2 -> 17.5; 128 or 256 keys within noise of 64).
    variant.block_n = kMaxDecodeBlockKeys;
  }
  variant.slm_bytes =
      decode_slm_bytes(variant.head_dim, variant.block_m, variant.block_n, elem_bytes,
                       variant.cpu_device, variant.matrix_m > 0,
                       variant.cpu_device && variant.matrix_m == 0, key_streams);
  if (variant.slm_bytes > limits.local_mem_bytes)
    throw std::runtime_error("ipex_flash: the decode kernel needs " +
                             std::to_string(variant.slm_bytes) + " bytes of local memory, " +
                             limits.name + " has " + std::to_string(limits.local_mem_bytes));
  return variant;
}

// The split kernel and the merge kernel, built together from one program.
KernelProgram decode_program(const KernelVariant& variant) {
  KernelProgram program{
      "programs/flash_decode.hpp",
      {variant.matrix_registers
           ? with_trailing(variant.instantiate("ipex_flash::flash_decode_xmx_kernel", true),
                           {variant.value_head_dim(), variant.value_split})
           : variant.instantiate("ipex_flash::flash_decode_kernel", /*matrix_args=*/true),
       "ipex_flash::flash_decode_merge_kernel<" + device_type_name(variant.dtype) + ">"},
      program_options(variant)};
  if (decode_mask_bits(variant)) program.kernels.push_back("ipex_flash::flash_mask_bits_kernel");
  return program;
}

bool decode_mask_bits(const KernelVariant& variant) {
  return variant.matrix_registers && (variant.features & FEATURE_MASK_BOOL) != 0 &&
         variant.block_n % 32 == 0;
}

int decode_heads_per_group(int heads_kv, int rows, int head_dim, bool cpu_device) {
  const int group_rows = decode_group_rows(rows);
  // The kernel's capacity is set by its compiled (padded) head dim; rounding up to 32 here
  // gives a capacity no larger than any kernel serving this head dim has.
  const int capacity =
      decode_row_capacity(static_cast<int>(ceil_div(head_dim, 32) * 32), cpu_device);
  return std::clamp(capacity / group_rows, 1, std::max(heads_kv, 1));
}

int decode_row_slices(int rows) { return static_cast<int>(ceil_div(rows, kMaxDecodeRows)); }

int64_t most_splits(int64_t keys) {
  return std::max<int64_t>(1, ceil_div(keys, kMinDecodeBlockKeys));
}

int decode_num_splits(int64_t requested, int batch, int heads_kv, int rows, int head_dim,
                      int64_t max_len_k, int compute_units, bool cpu_device) {
  if (requested > 0) return static_cast<int>(std::min(requested, most_splits(max_len_k)));
  const int64_t target_groups = 4 * static_cast<int64_t>(compute_units);
  const int heads_per_group = decode_heads_per_group(heads_kv, rows, head_dim, cpu_device);
  const int64_t groups = std::max<int64_t>(1, static_cast<int64_t>(batch) *
                                                  ceil_div(heads_kv, heads_per_group) *
                                                  decode_row_slices(rows));
  const int64_t wanted = (target_groups + groups - 1) / groups;
  const int64_t most = std::max<int64_t>(1, ceil_div(max_len_k, kMinKeysPerSplit));
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, most));
}

}  // namespace ipex_flash
