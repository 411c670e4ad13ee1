#include "host/launch/decode_launch.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/launch/mask_bits_launch.hpp"
#include "host/launch/submit.hpp"
#include "host/runtime/build_guard.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/runtime/kernel_cache.hpp"
#include "host/runtime/matrix_layout_probe.hpp"
#include "device/decode/params.hpp"
#include "device/kvcache/params.hpp"

namespace ipex_flash {
namespace {

constexpr int kMergeGroup = 64;

}  // namespace

int decode_splits(int64_t requested, int batch, int heads_kv, int rows, int head_dim,
                  int64_t max_len_k, std::uintptr_t queue_handle) {
  const DeviceLimits& limits = device_limits(queue_from_handle(queue_handle).get_device());
  return decode_num_splits(requested, batch, heads_kv, rows, head_dim, max_len_k,
                           limits.compute_units, limits.is_cpu);
}

KernelVariant decode_variant_on(sycl::queue& queue, const std::string& dtype, int head_dim,
                                int rows, int features, bool heads_interleaved,
                                SkipReasons* why, int head_dim_v) {
  const DeviceLimits& limits = device_limits(queue.get_device());
  return buildable_variant(
      queue,
      [&](const std::string& mode, SkipReasons* chosen) {
        return layout_verified_variant(
            queue, limits,
            [&](const DeviceLimits& verified, SkipReasons* reasons) {
              return decode_variant(dtype, head_dim, rows, features, heads_interleaved, verified,
                                    mode, reasons, head_dim_v);
            },
            chosen);
      },
      decode_program, why);
}

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
      /*heads_interleaved=*/heads_kv > 1 && k.strides[2] > k.strides[1], nullptr, head_dim_v);
}

int64_t decode_scratch_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& options, std::uintptr_t queue_handle) {
  if (!options.attn_mask || options.attn_mask->dtype != "bool") return 0;
  const KernelVariant variant = flash_decode_variant(q, k, v, options, queue_handle);
  MaskBitsParams bits{};
  return mask_bits_scratch(0, decode_mask_bits(variant), make_dims(q, k, v, options),
                           variant.block_n, attn_mask_params(options), bits)
      .total;
}

void flash_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, const TensorView& lse, const TensorView& partial_out,
                  const TensorView& partial_lse, const AttentionOptions& options,
                  std::uintptr_t queue_handle, const TensorView& scratch) {
  DecodeParams params{};
  params.common = make_common(q, k, v, lse, options);
  AttentionCommon& c = params.common;
  if (!flash_decode_supported(q, k, v, queue_handle))
    throw std::invalid_argument(
        "ipex_flash: flash_decode does not serve this problem (flash_decode_supported): more "
        "than " + std::to_string(kMaxDecodeRows) + " query rows per K/V head with more than " +
        std::to_string(max_sliced_decode_tokens(k.size(1))) + " new tokens (" +
        std::to_string(k.size(1)) +
        " K/V heads), a head dim whose decode kernel outgrows the device's local memory "
        "(decode_fits), or a 16-bit or FP8 cache whose rows are not word-aligned");
  const int rows = c.dims.heads_per_kv * c.dims.len_q;
  // decode/append.hpp: each new row written by the one work-group that reads it.
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
  // (the register form serves one K/V head per work-group: decode/xmx_kernel.hpp)
  params.heads_per_group =
      variant.matrix_registers
          ? 1
          : decode_heads_per_group(static_cast<int>(heads_kv), rows, c.dims.head_dim_max(),
                                   variant.cpu_device);
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
  MaskBitsParams bits{};
  const MaskBitsScratch layout = mask_bits_scratch(0, decode_mask_bits(variant), c.dims,
                                                   variant.block_n, c.score_mod.attn_mask, bits);
  if (layout.bytes() > 0) {
    const int64_t given = scratch.sizes.empty() ? 0 : scratch.size(0);
    if (scratch.dtype != "uint8" || given < layout.total)
      throw std::invalid_argument(
          "ipex_flash: flash_decode scratch must be a uint8 tensor of at least " +
          std::to_string(layout.total) + " bytes (decode_scratch_bytes) for a bool attn_mask, "
          "got " + std::to_string(given) + " " + scratch.dtype);
    pack_mask_bits(queue, kernels[2], c.dims, c.score_mod.attn_mask, layout, scratch.data, bits);
    // The register form reads the bits through the mask's own parameters (decode/row_scores.hpp):
    // the words, and byte strides of whole words.
    c.score_mod.attn_mask = AttnMaskParams{bits.words, 4 * bits.batch, 4 * bits.head,
                                           4 * bits.row, 0};
  }
  sycl::event done = submit_kernel(
      queue, kernels[0], params,
      block_range(c.dims.batch * ceil_div(heads_kv, params.heads_per_group) * params.row_slices,
                  c.num_blocks, kMaxDecodeRows * variant.value_split),
      "flash_decode");
  // One split writes the output itself where the kernel is built with the large register file
  // or for the CPU device (decode/traits.hpp, DECODE_ONE_SPLIT_WRITES).
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
                            std::uintptr_t queue_handle, int head_dim_v) {
  if (rows < 1 || rows > kMaxDecodeRows)
    throw std::invalid_argument("ipex_flash: warmup_decode: rows must be in [1, " +
                                std::to_string(kMaxDecodeRows) + "], got " + std::to_string(rows));
  if (head_dim_v < 0 || head_dim_v > kMaxHeadDim)
    throw std::invalid_argument("ipex_flash: warmup_decode: head_dim_v must be 0 (v's head dim is "
                                "head_dim) or in [1, " + std::to_string(kMaxHeadDim) + "], got " +
                                std::to_string(head_dim_v));
  sycl::queue& queue = queue_from_handle(queue_handle);
  const bool value_dim = head_dim_v > 0 && head_dim_v != head_dim;
  // As flash_decode_variant plans a call: flash-attn's (B, N, H, D) cache, as serving calls
  // pass it; with a value head dim of its own MLA's one latent K/V head, whose rows hold no
  // other heads.
  const KernelVariant variant = decode_variant_on(
      queue, dtype, std::max(head_dim, head_dim_v), rows, value_dim ? FEATURE_VALUE_DIM : 0,
      /*heads_interleaved=*/!value_dim, nullptr, value_dim ? head_dim_v : 0);
  get_kernels(queue, decode_program(variant));
  return variant;
}

}  // namespace ipex_flash
