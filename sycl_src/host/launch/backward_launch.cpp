#include "host/launch/backward_launch.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <stdexcept>
#include <vector>

#include "host/launch/mask_bits_launch.hpp"
#include "host/launch/submit.hpp"
#include "host/runtime/build_guard.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/runtime/kernel_cache.hpp"
#include "host/runtime/matrix_layout_probe.hpp"
#include "host/variants/backward_variant.hpp"
#include "device/backward/params.hpp"
#include "device/matrix/pack_rows.hpp"

namespace ipex_flash {
namespace {

constexpr int kPreprocessGroup = 64;

// Where the packed copies (backward/pack_operands.hpp) keep each sequence's key blocks and query row blocks.
struct BwdPacks {
  PackRows keys, rows;
};

BwdPacks bwd_packs(const AttentionDims& dims, const TensorView& q, const TensorView& k,
                   const AttentionOptions& options, const KernelVariant& variant) {
  return {key_pack_rows(dims, k, options, variant.block_n),
          row_pack_rows(dims, q, options, variant.block_m)};
}

// Where the packed copies start: at a multiple of their larger tile where the kernels address
// tiles by OR (bwd_pack_alignment, matrix/pack_rows.hpp); anywhere (1) otherwise.
int64_t bwd_pack_start_alignment(const KernelVariant& variant) {
  if (variant.matrix_m == 0) return 1;
  return bwd_pack_alignment(variant.head_dim, variant.matrix_n, variant.block_m,
                            variant.block_n);
}

// Bytes of the packed copies (PackedBwd's tiles), in the 16-bit input dtype: K, K^T, V per key
// block, and K^T, V^T in pairs for the register dK/dV kernel; Q^T, dO^T per query block, and Q
// and dO row pairs (SLM-staged dK/dV) or Q, dO, Q^T, dO^T (register dK/dV); with OR-addressed
// tiles the key region rounded up to whole row tiles, and room to align the start. 0 for the
// vector kernels, which read the tensors in place.
int64_t packed_bwd_bytes(const AttentionDims& dims, const BwdPacks& packs,
                         const KernelVariant& variant) {
  if (variant.matrix_m == 0) return 0;
  const int64_t element = 2, d = variant.head_dim;
  const int key_tiles = variant.dkdv_registers ? 5 : 3;
  const int row_tiles = variant.dkdv_registers ? 6 : 4;
  const int64_t align = bwd_pack_start_alignment(variant);
  const int64_t row_tile = align > 1 ? variant.block_m * d : 1;  // elements
  const int64_t keys = round_up_to(
      static_cast<int64_t>(dims.heads_kv()) * packs.keys.blocks * key_tiles * variant.block_n * d,
      row_tile);
  const int64_t rows = static_cast<int64_t>(dims.heads_q) * packs.rows.blocks * row_tiles *
                       variant.block_m * d;
  return element * (keys + rows) + align - 1;
}

// The scratch: the packs, then the bool mask's bits where the variant reads them.
MaskBitsScratch bwd_scratch(const AttentionDims& dims, const BwdPacks& packs,
                            const KernelVariant& variant, const AttnMaskParams& mask,
                            MaskBitsParams& bits) {
  return mask_bits_scratch(packed_bwd_bytes(dims, packs, variant), bwd_mask_bits(variant), dims,
                           variant.block_n, mask, bits);
}

struct BwdKernels {
  sycl::kernel preprocess, dkdv, dq;
  std::vector<sycl::kernel> pack;  // matrix kernels: the key and the row packing, the mask's bits
};

BwdKernels bwd_kernels(sycl::queue& queue, const KernelVariant& variant) {
  const std::vector<sycl::kernel> kernels = get_kernels(queue, bwd_program(variant));
  if (variant.matrix_m == 0) return BwdKernels{kernels[0], kernels[1], kernels[2], {}};
  BwdKernels found{kernels[0], kernels[3], kernels[4], {kernels[1], kernels[2]}};
  if (bwd_mask_bits(variant)) found.pack.push_back(kernels[5]);
  return found;
}

}  // namespace

KernelVariant bwd_variant_on(sycl::queue& queue, const std::string& dtype, int head_dim,
                             int features, SkipReasons* why) {
  const DeviceLimits& limits = device_limits(queue.get_device());
  return buildable_variant(
      queue,
      [&](const std::string& mode, SkipReasons* chosen) {
        return layout_verified_variant(
            queue, limits,
            [&](const DeviceLimits& verified, SkipReasons* reasons) {
              return bwd_variant(dtype, head_dim, features, verified, mode, reasons);
            },
            chosen);
      },
      bwd_program, why);
}

void flash_bwd(const BwdTensors& t, const AttentionOptions& options,
               std::uintptr_t queue_handle) {
  if (options.block_table || options.seqlens_k)
    throw std::invalid_argument("ipex_flash: attention over a KV cache has no backward");
  if (kv_feature(t.k.dtype) != 0)
    throw std::invalid_argument("ipex_flash: attention over FP8 keys and values has no backward");
  BwdParams params{};
  params.common = make_common(t.q, t.k, t.v, t.lse, options);
  AttentionCommon& c = params.common;
  const AttentionDims& dims = c.dims;
  sycl::queue& queue = queue_from_handle(queue_handle);
  const KernelVariant variant =
      bwd_variant_on(queue, t.q.dtype, dims.head_dim_max(), features_of(options, t.k));
  params.q = reinterpret_cast<const void*>(t.q.data);
  params.k = reinterpret_cast<const void*>(t.k.data);
  params.v = reinterpret_cast<const void*>(t.v.data);
  params.out = reinterpret_cast<const void*>(t.out.data);
  params.dout = reinterpret_cast<const void*>(t.dout.data);
  params.dq = reinterpret_cast<void*>(t.dq.data);
  params.dk = reinterpret_cast<void*>(t.dk.data);
  params.dv = reinterpret_cast<void*>(t.dv.data);
  params.lse = reinterpret_cast<const float*>(t.lse.data);
  params.delta = reinterpret_cast<float*>(t.delta.data);
  params.q_stride = bhnd_strides(t.q, "q");
  params.k_stride = bhnd_strides(t.k, "k");
  params.v_stride = bhnd_strides(t.v, "v");
  params.out_stride = bhnd_strides(t.out, "out");
  params.dout_stride = bhnd_strides(t.dout, "grad_out");
  params.dq_stride = bhnd_strides(t.dq, "dq");
  params.dk_stride = bhnd_strides(t.dk, "dk");
  params.dv_stride = bhnd_strides(t.dv, "dv");
  if (options.cu_seqlens_q)  // packed sequences are found through cu_seqlens
    params.q_stride.batch = params.out_stride.batch = params.dout_stride.batch =
        params.dq_stride.batch = 0;
  if (options.cu_seqlens_k)
    params.k_stride.batch = params.v_stride.batch = params.dk_stride.batch =
        params.dv_stride.batch = 0;
  const int64_t heads_kv = dims.heads_kv();
  if (dims.batch == 0 || heads_kv == 0 || dims.len_k <= 0) return;

  const BwdKernels kernels = bwd_kernels(queue, variant);
  const bool matrix = variant.matrix_m > 0;
  // The SLM-staged matrix dK/dV kernel gives a work-item each query row of a block
  // (flash_bwd_matrix.hpp); the vector and register ones each key (the register one, each
  // key's shares).
  const BwdShares shares = bwd_shares(variant);
  const int dkdv_group =
      matrix && !variant.dkdv_registers ? variant.block_m : variant.block_n * shares.dkdv;
  sycl::event done;
  if (dims.len_q > 0) {
    const int64_t rows = static_cast<int64_t>(dims.batch) * dims.heads_q * dims.len_q;
    submit_kernel(queue, kernels.preprocess, params,
                  block_range(1, ceil_div(rows, kPreprocessGroup), kPreprocessGroup),
                  "flash_bwd_preprocess");
  }
  if (matrix) {  // the packed copies, before the kernels that read them (the queue is in order)
    const BwdPacks packs = bwd_packs(dims, t.q, t.k, options, variant);
    const MaskBitsScratch layout =
        bwd_scratch(dims, packs, variant, c.score_mod.attn_mask, params.mask_bits);
    const int64_t needed = layout.total;
    const int64_t given = t.scratch.sizes.empty() ? 0 : t.scratch.size(0);
    if (t.scratch.dtype != "uint8" || given < needed)
      throw std::invalid_argument("ipex_flash: flash_bwd scratch must be a uint8 tensor of at least " +
                                  std::to_string(needed) + " bytes (bwd_scratch_bytes), got " +
                                  std::to_string(given) + " " + t.scratch.dtype);
    params.packed = reinterpret_cast<void*>(
        round_up_to(static_cast<int64_t>(t.scratch.data), bwd_pack_start_alignment(variant)));
    params.key_pack = packs.keys;
    params.row_pack = packs.rows;
    if (packs.keys.blocks > 0)
      submit_kernel(queue, kernels.pack[0], params,
                    block_range(heads_kv, packs.keys.blocks, variant.block_n),
                    "flash_bwd_pack_keys");
    if (dims.len_q > 0 && packs.rows.blocks > 0)
      submit_kernel(queue, kernels.pack[1], params,
                    block_range(dims.heads_q, packs.rows.blocks, variant.block_m),
                    "flash_bwd_pack_rows");
    if (layout.bytes() > 0)  // the program has the packing kernel
      pack_mask_bits(queue, kernels.pack[2], dims, c.score_mod.attn_mask, layout, t.scratch.data,
                     params.mask_bits);
  }
  // dK and dV run over every key even with no query rows (they are then zero).
  c.num_blocks = static_cast<int32_t>(ceil_div(dims.len_k, variant.block_n));
  done = submit_kernel(queue, kernels.dkdv, params,
                       block_range(dims.batch * heads_kv, c.num_blocks, dkdv_group),
                       "flash_bwd_dkdv");
  if (dims.len_q > 0) {
    c.num_blocks = static_cast<int32_t>(ceil_div(dims.len_q, variant.block_m));
    done = submit_kernel(
        queue, kernels.dq, params,
        block_range(static_cast<int64_t>(dims.batch) * dims.heads_q, c.num_blocks,
                    variant.block_m * shares.dq),
        "flash_bwd_dq");
  }
  finish_launch(queue, queue_handle, done, "flash_bwd");
}

int64_t bwd_scratch_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options, std::uintptr_t queue_handle) {
  const AttentionDims dims = make_dims(q, k, v, options);
  const KernelVariant variant = bwd_variant_on(queue_from_handle(queue_handle), q.dtype,
                                               dims.head_dim_max(), features_of(options, k));
  if (variant.matrix_m == 0) return 0;
  MaskBitsParams bits{};
  return bwd_scratch(dims, bwd_packs(dims, q, k, options, variant), variant,
                     attn_mask_params(options), bits)
      .total;
}

KernelVariant warmup_bwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  const KernelVariant variant = bwd_variant_on(queue, dtype, head_dim, 0);
  bwd_kernels(queue, variant);
  return variant;
}

}  // namespace ipex_flash
