#include "host/launch/forward_launch.hpp"

#include <algorithm>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/launch/mask_bits_launch.hpp"
#include "host/launch/submit.hpp"
#include "host/runtime/build_guard.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/runtime/kernel_cache.hpp"
#include "host/runtime/matrix_layout_probe.hpp"
#include "host/variants/forward_variant.hpp"
#include "device/forward/params.hpp"
#include "device/matrix/pack_rows.hpp"

namespace ipex_flash {
namespace {

// Bytes of one block of the packed K/V copy (forward/pack_kv.hpp): K and V^T of its keys, in
// the input's 16-bit dtype.
int64_t pack_block_bytes(const KernelVariant& variant) {
  return static_cast<int64_t>(variant.block_n) * (variant.head_dim + variant.value_head_dim()) *
         2;
}

// Where the packed K/V copy starts (fwd_pack_alignment, matrix/pack_rows.hpp).
int64_t pack_alignment(const KernelVariant& variant) {
  return fwd_pack_alignment(variant.head_dim, variant.value_head_dim(), variant.block_n,
                            variant.matrix_n, variant.matrix_registers);
}

// Bytes of the scratch the packed K/V copy takes laid out as `pack`: every block, and room to
// align its start; 0 for the vector kernel, which reads K and V in place.
int64_t packed_kv_bytes(const AttentionDims& dims, const PackRows& pack,
                        const KernelVariant& variant) {
  if (variant.matrix_m == 0) return 0;
  return static_cast<int64_t>(dims.heads_kv()) * pack.blocks * pack_block_bytes(variant) +
         pack_alignment(variant) - 1;
}

// The scratch: the packed K/V, then the bool mask's bits where the variant reads them.
MaskBitsScratch fwd_scratch(const AttentionDims& dims, const PackRows& pack,
                            const KernelVariant& variant, const AttnMaskParams& mask,
                            MaskBitsParams& bits) {
  return mask_bits_scratch(packed_kv_bytes(dims, pack, variant), fwd_mask_bits(variant), dims,
                           variant.block_n, mask, bits);
}

}  // namespace

KernelVariant fwd_variant_on(sycl::queue& queue, const std::string& dtype, int head_dim,
                             int head_dim_v, int features, SkipReasons* why) {
  const DeviceLimits& limits = device_limits(queue.get_device());
  return buildable_variant(
      queue,
      [&](const std::string& mode, SkipReasons* chosen) {
        return layout_verified_variant(
            queue, limits,
            [&](const DeviceLimits& verified, SkipReasons* reasons) {
              return fwd_variant(dtype, head_dim, head_dim_v, features, verified, mode, reasons);
            },
            chosen);
      },
      fwd_program, why);
}

void flash_fwd(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& out, const TensorView& lse, const TensorView& scratch,
               const AttentionOptions& options, std::uintptr_t queue_handle) {
  FwdParams params{};
  params.common = make_common(q, k, v, lse, options);
  AttentionCommon& c = params.common;
  if (c.dims.batch == 0 || c.dims.heads_q == 0 || c.dims.len_q <= 0) return;

  sycl::queue& queue = queue_from_handle(queue_handle);
  const KernelVariant variant = fwd_variant_on(queue, q.dtype, c.dims.head_dim,
                                               c.dims.head_dim_v, features_of(options, k));
  set_forward_tensors(params, q, k, v, out, lse);
  // Packed sequences are found through cu_seqlens, not a batch stride.
  if (options.cu_seqlens_q) params.q_stride.batch = params.out_stride.batch = 0;
  if (options.cu_seqlens_k) params.k_stride.batch = params.v_stride.batch = 0;
  c.num_blocks = static_cast<int32_t>(ceil_div(c.dims.len_q, variant.block_m));

  const std::vector<sycl::kernel> kernels = get_kernels(queue, fwd_program(variant));
  const int64_t batch_heads = static_cast<int64_t>(c.dims.batch) * c.dims.heads_q;
  if (variant.matrix_m > 0) {
    params.kv_pack = key_pack_rows(c.dims, k, options, variant.block_n);
    const MaskBitsScratch layout =
        fwd_scratch(c.dims, params.kv_pack, variant, c.score_mod.attn_mask, params.mask_bits);
    const int64_t needed = layout.total;
    const int64_t given = scratch.sizes.empty() ? 0 : scratch.size(0);
    if (scratch.dtype != "uint8" || given < needed)
      throw std::invalid_argument("ipex_flash: flash_fwd scratch must be a uint8 tensor of at least " +
                                  std::to_string(needed) + " bytes (fwd_scratch_bytes), got " +
                                  std::to_string(given) + " " + scratch.dtype);
    params.kv_packed = reinterpret_cast<void*>(
        round_up_to(static_cast<int64_t>(scratch.data), pack_alignment(variant)));
    if (params.kv_pack.blocks > 0)  // none: no sequence has a key to read
      submit_kernel(queue, kernels[1], params,
                    block_range(c.dims.heads_kv(), params.kv_pack.blocks, variant.block_n),
                    "flash_fwd_pack_kv");  // the queue is in order: done before the next launch
    if (layout.bytes() > 0)  // the program has the packing kernel
      pack_mask_bits(queue, kernels[2], c.dims, c.score_mod.attn_mask, layout, scratch.data,
                     params.mask_bits);
  }
  sycl::event done = submit_kernel(queue, kernels[0], params,
                                   block_range(batch_heads, c.num_blocks,
                                               variant.block_m * variant.value_split),
                                   "flash_fwd");
  finish_launch(queue, queue_handle, done, "flash_fwd");
}

int64_t fwd_scratch_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options, std::uintptr_t queue_handle) {
  const AttentionDims dims = make_dims(q, k, v, options);
  const KernelVariant variant = fwd_variant_on(queue_from_handle(queue_handle), q.dtype,
                                               dims.head_dim, dims.head_dim_v,
                                               features_of(options, k));
  if (variant.matrix_m == 0) return 0;
  MaskBitsParams bits{};
  return fwd_scratch(dims, key_pack_rows(dims, k, options, variant.block_n), variant,
                     attn_mask_params(options), bits)
      .total;
}

KernelVariant warmup_fwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  const KernelVariant variant = fwd_variant_on(queue, dtype, head_dim, head_dim, 0);
  get_kernels(queue, fwd_program(variant));
  return variant;
}

}  // namespace ipex_flash
