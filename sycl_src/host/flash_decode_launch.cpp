#include "host/flash_decode_launch.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/build_guard.hpp"
#include "host/device_queue.hpp"
#include "host/kernel_cache.hpp"
#include "host/launch.hpp"
#include "host/matrix_path.hpp"
#include "host/variants.hpp"
#include "device/decode/params.hpp"
#include "device/kvcache/params.hpp"

namespace ipex_flash {
namespace {

constexpr int kMinKeysPerSplit = 256;  // below this a split costs more to merge than it saves
constexpr int kMergeGroup = 64;
// Keys per online-softmax update (BLOCK_N): as many as make one K/V head's rows of a block
// about 8 KB (16 fp32 rows of d = 128, 32 bf16 ones), within [16, 64] and a power of two (a
// multiple of the matrix tile's 16 rows). The work paid once per block (lane reductions of the
// softmax, the score tile, barriers) then costs the same per byte read for every dtype and
// head dim, and a block's K and V rows stay in L1 between the scores and P.V. Measured on the
// 2-core CPU device: bf16 d = 128 0.58 -> 0.66x the speed of a copy with 32 keys
// instead of 16; fp32 d = 128 loses with 64, bf16 d = 64 gains with 64.
constexpr int kDecodeBlockBytes = 8192;
constexpr int kMinDecodeBlockKeys = 16, kMaxDecodeBlockKeys = 64;

// Bytes of one K/V element: the input's, or 1 for an FP8 cache (features).
int kv_element_bytes(const std::string& dtype, int features) {
  return (features & FEATURE_KV_FP8) != 0 ? 1 : dtype == "float32" ? 4 : 2;
}

int decode_block_keys(int kv_bytes, int head_dim) {
  const int row_bytes = head_dim * kv_bytes;
  int keys = kMinDecodeBlockKeys;
  while (keys < kMaxDecodeBlockKeys && 2 * keys * row_bytes <= kDecodeBlockBytes) keys *= 2;
  return keys;
}

// Whether every row of a K/V cache (or page pool) of kv_bytes elements starts on a 4-byte
// boundary: its data pointer, and every stride but the contiguous last one, in whole 4-byte
// words.
bool word_aligned_rows(const TensorView& t, int kv_bytes) {
  if (t.data % 4 != 0) return false;
  for (size_t dim = 0; dim + 1 < t.strides.size(); ++dim)
    if (t.strides[dim] * kv_bytes % 4 != 0) return false;
  return true;
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

// Bytes of local memory the decode kernel declares (flash_decode.hpp, its work_group_static
// arrays) for a compiled head dim, GROUP_ROWS, BLOCK_N and element size; the matrix-score
// buffers only when `matrix`, every head's probabilities only when `step_major` (the CPU
// device's vector scores, DECODE_STEP_MAJOR), every head's factors only with `key_streams`.
size_t decode_slm_bytes(int head_dim, int group_rows, int block_n, size_t elem_bytes,
                        bool matrix, bool step_major, bool key_streams) {
  const size_t d = head_dim, lanes = DECODE_LANES, keys = block_n;
  const size_t max_heads = decode_row_capacity(head_dim) / group_rows;
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

// Whether the decode kernel reads its keys as streams (decode_streams.hpp): on the CPU device
// (its vector scores, step-major), with at least 4 keys per step (at most 4 query rows per K/V
// head), for a cache whose key rows hold the heads side by side. Measured on the CPU device:
// with 8 rows per head, or a (B, H, N, D) cache, the consecutive order is faster.
bool decode_key_streams(const KernelVariant& variant, bool heads_interleaved) {
  return variant.cpu_device && variant.matrix_m == 0 && heads_interleaved &&
         DECODE_LANES / variant.block_m >= 4;
}

}  // namespace

// One work-group of kMaxDecodeRows work-items (one sub-group) per (batch, group of K/V heads,
// split); the kernel is specialised on the rows rounded up to a power of two, which sizes its
// P.V accumulators. Scores go to the matrix engine where the forward would use it and the
// local memory holds its buffers.
KernelVariant decode_variant(const std::string& dtype, int head_dim, int rows, int features,
                             bool heads_interleaved, const DeviceLimits& limits,
                             const std::string& mode) {
  const int kv_bytes = kv_element_bytes(dtype, features);
  KernelVariant variant = base_variant(dtype, head_dim, limits);
  variant.head_dim = decode_head_dim(kv_bytes, variant.head_dim);
  variant.block_m = decode_group_rows(rows);
  variant.block_n = decode_block_keys(kv_bytes, variant.head_dim);
  variant.features = features;
  const size_t elem_bytes = dtype == "float32" ? 4 : 2;
  // FP8 caches (kv_quant.hpp) compute their scores on the vector units.
  if (kv_bytes == 1 && !limits.fp8_decode)
    throw std::invalid_argument("ipex_flash: FP8 caches on " + limits.name +
                                " run the general kernel (flash_decode_supported)");
  const MatrixTile tile = kv_bytes == 1 ? MatrixTile{}
                                        : matrix_tile(limits, dtype, variant.head_dim, mode);
  const size_t matrix_slm =
      decode_slm_bytes(variant.head_dim, variant.block_m, variant.block_n, elem_bytes, true, false,
                       false);
  // The scores' tile is as wide as the kernel's sub-group (DECODE_LANES): N = 8 engines (DG2,
  // Arrow Lake-H) compute decode scores on the vector units.
  if (tile.m > 0 && tile.n == DECODE_LANES && matrix_slm <= limits.local_mem_bytes) {
    variant.matrix_m = tile.m;
    variant.matrix_k = tile.k;
    variant.matrix_emulated = tile.emulated;
  }
  const bool key_streams = decode_key_streams(variant, heads_interleaved);
  if (key_streams) {
    variant.features |= FEATURE_KEY_STREAMS;
    // The most keys per block: V is read in a pass of its own, so a block's rows need not stay
    // in L1, and the softmax and barriers come less often (CPU device: bf16 12.0 -> 11.2 ms,
    // fp32 18.2 -> 17.5; 128 or 256 keys within noise of 64).
    variant.block_n = kMaxDecodeBlockKeys;
  }
  variant.slm_bytes =
      decode_slm_bytes(variant.head_dim, variant.block_m, variant.block_n, elem_bytes,
                       variant.matrix_m > 0, variant.cpu_device && variant.matrix_m == 0,
                       key_streams);
  if (variant.slm_bytes > limits.local_mem_bytes)
    throw std::runtime_error("ipex_flash: the decode kernel needs " +
                             std::to_string(variant.slm_bytes) + " bytes of local memory, " +
                             limits.name + " has " + std::to_string(limits.local_mem_bytes));
  return variant;
}

// The split kernel and the merge kernel, built together from one program.
KernelProgram decode_program(const KernelVariant& variant) {
  return {"programs/flash_decode.hpp",
          {variant.instantiate("ipex_flash::flash_decode_kernel", /*matrix_args=*/true),
           "ipex_flash::flash_decode_merge_kernel<" + device_type_name(variant.dtype) + ">"},
          program_options(variant)};
}

int decode_heads_per_group(int heads_kv, int rows, int head_dim) {
  const int group_rows = decode_group_rows(rows);
  // The kernel's capacity is set by its compiled (padded) head dim; rounding up to 32 here
  // gives a capacity no larger than any kernel serving this head dim has.
  const int capacity = decode_row_capacity(static_cast<int>(ceil_div(head_dim, 32) * 32));
  return std::clamp(capacity / group_rows, 1, std::max(heads_kv, 1));
}

int decode_row_slices(int rows) { return static_cast<int>(ceil_div(rows, kMaxDecodeRows)); }

int decode_num_splits(int batch, int heads_kv, int rows, int head_dim, int max_len_k,
                      std::uintptr_t queue_handle) {
  const DeviceLimits& limits = device_limits(queue_from_handle(queue_handle).get_device());
  const int64_t target_groups = 4 * static_cast<int64_t>(limits.compute_units);
  const int heads_per_group = decode_heads_per_group(heads_kv, rows, head_dim);
  const int64_t groups = std::max<int64_t>(1, static_cast<int64_t>(batch) *
                                                  ceil_div(heads_kv, heads_per_group) *
                                                  decode_row_slices(rows));
  const int64_t wanted = (target_groups + groups - 1) / groups;
  const int64_t most = std::max<int64_t>(1, ceil_div(max_len_k, kMinKeysPerSplit));
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, most));
}

namespace {

// The variant decode_variant picks for the queue's device, with its scores on the vector units
// where the device's compiler cannot build its matrix program (build_guard.hpp).
KernelVariant decode_variant_on(sycl::queue& queue, const std::string& dtype, int head_dim,
                                int rows, int features, bool heads_interleaved) {
  const DeviceLimits& limits = device_limits(queue.get_device());
  return buildable_variant(
      queue,
      [&](const std::string& mode) {
        return decode_variant(dtype, head_dim, rows, features, heads_interleaved, limits, mode);
      },
      decode_program);
}

}  // namespace

KernelVariant flash_decode_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AttentionOptions& options, std::uintptr_t queue_handle) {
  const int64_t heads_kv = std::max<int64_t>(k.size(1), 1);
  const int rows = static_cast<int>(q.size(1) / heads_kv * q.size(2));
  const int head_dim = static_cast<int>(q.size(3)), head_dim_v = static_cast<int>(v.size(3));
  return decode_variant_on(
      queue_from_handle(queue_handle), q.dtype, std::max(head_dim, head_dim_v), rows,
      features_of(options, k) | (head_dim_v != head_dim ? FEATURE_VALUE_DIM : 0) |
          (options.k_new ? FEATURE_APPEND : 0) |
          (!options.rotary_cos                      ? 0
           : options.rotary_cos->dtype == "float32" ? FEATURE_ROTARY_F32
                                                    : FEATURE_ROTARY_INPUT),
      /*heads_interleaved=*/heads_kv > 1 && k.strides[2] > k.strides[1]);
}

bool flash_decode_supported(const TensorView& q, const TensorView& k, const TensorView& v,
                            std::uintptr_t queue_handle) {
  const int64_t heads_kv = k.size(1);
  if (heads_kv <= 0) return false;
  const int64_t rows = (q.size(1) / heads_kv) * q.size(2);
  if (rows > kMaxDecodeRows && q.size(2) > max_sliced_decode_tokens(heads_kv)) return false;
  if (kv_feature(k.dtype) != 0 &&
      !device_limits(queue_from_handle(queue_handle).get_device()).fp8_decode)
    return false;
  // The decode kernel reads 16-bit and FP8 rows a 32-bit word at a time.
  const int kv_bytes = kv_element_bytes(k.dtype, kv_feature(k.dtype));
  return kv_bytes == 4 || (word_aligned_rows(k, kv_bytes) && word_aligned_rows(v, kv_bytes) &&
                           q.size(3) * kv_bytes % 4 == 0 && v.size(3) * kv_bytes % 4 == 0);
}

void flash_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, const TensorView& lse, const TensorView& partial_out,
                  const TensorView& partial_lse, const AttentionOptions& options,
                  std::uintptr_t queue_handle) {
  DecodeParams params{};
  params.common = make_common(q, k, v, lse, options);
  AttentionCommon& c = params.common;
  if (!flash_decode_supported(q, k, v, queue_handle))
    throw std::invalid_argument(
        "ipex_flash: flash_decode does not serve this problem (flash_decode_supported): more "
        "than " + std::to_string(kMaxDecodeRows) + " query rows per K/V head with more than " +
        std::to_string(max_sliced_decode_tokens(k.size(1))) + " new tokens (" +
        std::to_string(k.size(1)) +
        " K/V heads), or a 16-bit or FP8 cache whose rows are not word-aligned");
  const int rows = c.dims.heads_per_kv * c.dims.len_q;
  // decode_append.hpp: each new row written by the one work-group that reads it.
  if (options.k_new && (decode_row_slices(rows) != 1 || !options.v_new || !options.seqlens_k ||
                        options.k_new->dtype != q.dtype || options.v_new->dtype != q.dtype))
    throw std::invalid_argument(
        "ipex_flash: flash_decode appends k_new, v_new in q's dtype to a cache of known "
        "lengths, with at most " + std::to_string(kMaxDecodeRows) + " query rows per K/V head");
  if (options.rotary_cos && (!options.k_new || !options.rotary_sin))
    throw std::invalid_argument("ipex_flash: flash_decode rotates only with an append, and "
                                "needs both tables");
  if (c.dims.batch == 0 || rows == 0) return;
  sycl::queue& queue = queue_from_handle(queue_handle);
  const KernelVariant variant = flash_decode_variant(q, k, v, options, queue_handle);
  set_forward_tensors(params, q, k, v, out, lse);
  params.bounds = cache_bounds(k, options);
  const int64_t heads_kv = c.dims.heads_kv();
  params.heads_per_group =
      decode_heads_per_group(static_cast<int>(heads_kv), rows, c.dims.head_dim_max());
  params.row_slices = decode_row_slices(rows);
  if (options.k_new) {
    params.k_new = reinterpret_cast<const void*>(options.k_new->data);
    params.v_new = reinterpret_cast<const void*>(options.v_new->data);
    params.k_new_stride = bhnd_strides(*options.k_new, "k_new");
    params.v_new_stride = bhnd_strides(*options.v_new, "v_new");
  }
  if (options.rotary_cos) {
    const TensorView& cos = *options.rotary_cos;
    params.rotary = RotaryParams{reinterpret_cast<const void*>(cos.data),
                                 reinterpret_cast<const void*>(options.rotary_sin->data),
                                 cos.strides.at(0), static_cast<int32_t>(2 * cos.size(1)),
                                 options.rotary_interleaved,
                                 options.rotary_q_positions_advance,
                                 static_cast<int32_t>(cos.size(0))};
  }
  params.partial_out = reinterpret_cast<float*>(partial_out.data);
  params.partial_lse = reinterpret_cast<float*>(partial_lse.data);
  c.num_blocks = static_cast<int32_t>(partial_lse.size(-1));
  params.split_keys = static_cast<int32_t>(
      ceil_div(ceil_div(std::max(c.dims.len_k, 1), c.num_blocks), variant.block_n) *
      variant.block_n);

  const std::vector<sycl::kernel> kernels = get_kernels(queue, decode_program(variant));
  sycl::event done = submit_kernel(
      queue, kernels[0], params,
      block_range(c.dims.batch * ceil_div(heads_kv, params.heads_per_group) * params.row_slices,
                  c.num_blocks, kMaxDecodeRows),
      "flash_decode");
  // One split writes the output itself where the kernel is built with the large register file
  // or for the CPU device (decode_traits.hpp, DECODE_ONE_SPLIT_WRITES).
  if (c.num_blocks > 1 || !(variant.large_grf || variant.cpu_device)) {
    const int64_t query_rows =
        static_cast<int64_t>(c.dims.batch) * c.dims.heads_q * c.dims.len_q;
    done = submit_kernel(queue, kernels[1], params,
                         block_range(1, ceil_div(query_rows, kMergeGroup), kMergeGroup),
                         "flash_decode_merge");
  }
  finish_launch(queue, queue_handle, done, "flash_decode");
}

KernelVariant warmup_decode(const std::string& dtype, int head_dim, int rows,
                            std::uintptr_t queue_handle) {
  if (rows < 1 || rows > kMaxDecodeRows)
    throw std::invalid_argument("ipex_flash: warmup_decode: rows must be in [1, " +
                                std::to_string(kMaxDecodeRows) + "], got " + std::to_string(rows));
  sycl::queue& queue = queue_from_handle(queue_handle);
  // flash-attn's (B, N, H, D) cache, as serving calls pass it.
  const KernelVariant variant =
      decode_variant_on(queue, dtype, head_dim, rows, 0, /*heads_interleaved=*/true);
  get_kernels(queue, decode_program(variant));
  return variant;
}

}  // namespace ipex_flash
