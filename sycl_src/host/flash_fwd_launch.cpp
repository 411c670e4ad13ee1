#include "host/flash_fwd_launch.hpp"

#include <algorithm>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/build_guard.hpp"
#include "host/device_queue.hpp"
#include "host/kernel_cache.hpp"
#include "host/launch.hpp"
#include "host/matrix_layout_probe.hpp"
#include "host/matrix_path.hpp"
#include "device/forward/params.hpp"

namespace ipex_flash {
namespace {

size_t fwd_slm_bytes(int head_dim, int head_dim_v, int block_m, int block_n) {
  // Q (d, q) and the output accumulator (dv, q), K (kv, d) and V (kv, dv) tiles, all float32.
  return sizeof(float) * (static_cast<size_t>(head_dim + head_dim_v) * block_m +
                          static_cast<size_t>(block_n) * (head_dim + head_dim_v));
}

size_t fwd_matrix_slm_bytes(int head_dim, int block_m, int block_n) {
  // Q (d, q) and P (kv, q) in the 16-bit input dtype; scores (kv, q) and the output
  // accumulator (d, q) in float32. K and V are read from the packed copy in global memory.
  const size_t hd = head_dim, bm = block_m, bn = block_n;
  return 2 * (hd * bm + bn * bm) + sizeof(float) * (bn * bm + hd * bm);
}

size_t fwd_matrix_registers_slm_bytes(int head_dim, int block_m, int) {
  return 2 * static_cast<size_t>(head_dim) * block_m;  // Q^T (d, q) in the 16-bit dtype
}


// Bytes of the packed K/V copy (fwd_pack_kv.hpp) laid out as `pack`: K and V^T of every
// block, in the input's 16-bit dtype; 0 for the vector kernel, which reads K and V in place.
int64_t packed_kv_bytes(const AttentionDims& dims, const PackRows& pack,
                        const KernelVariant& variant) {
  if (variant.matrix_m == 0) return 0;
  return static_cast<int64_t>(dims.heads_kv()) * pack.blocks * variant.block_n *
         (variant.head_dim + variant.value_head_dim()) * 2;
}

// The variant fwd_variant picks for the queue's device, or the vector kernel's where the
// device's compiler cannot build its matrix program (build_guard.hpp).
KernelVariant fwd_variant_on(sycl::queue& queue, const std::string& dtype, int head_dim,
                             int head_dim_v, int features) {
  const DeviceLimits& limits = device_limits(queue.get_device());
  return buildable_variant(
      queue,
      [&](const std::string& mode) {
        return layout_verified_variant(queue, limits, [&](const DeviceLimits& verified) {
          return fwd_variant(dtype, head_dim, head_dim_v, features, verified, mode);
        });
      },
      fwd_program);
}

// The pack's order (fwd_pack_kv.hpp, matrix_surface.hpp): tile by tile for the 8-wide
// register kernel, which reads its A tiles without 2-D block loads; row-major (0, 0) otherwise.
std::string pack_tile_order(const KernelVariant& variant) {
  return variant.tile_order(variant.matrix_registers && variant.matrix_n == 8);
}

// The register forward's sub-groups per query rows on the 8-wide engines (DG2, Arrow Lake-H:
// 128 registers of 32 bytes, a sub-group's O^T taking d_v of them), each holding its share of
// O^T (VALUE_SPLIT, flash_fwd_matrix_registers.hpp); 0 where they keep the SLM-staged kernel.
// One up to d_v = 64, two up to 128 (a whole O^T filled the registers). With ALiBi or a user's
// mask, the fewest (two to four) whose shares are whole tiles, two at least (an array of one
// tile made IGC drop the work), and at most 40 rows of O^T: two from 32 to 80, three at 96,
// four at 128; none at 16 and 112. Beside a whole O^T at d = 64 their per-score work spilled
// 64 bytes (ALiBi) and 2-2.2 KB (masks) on DG2, beside 56 rows at 112, 1.8 KB (masks).
// Softcap alone counts as no change: its tanh (score_mod.hpp) needs no register per score.
// With ALiBi or a mask as well none: there it takes sycl::tanh, 165 instructions per DPAS on
// DG2 in registers, 137 SLM-staged.
int eight_wide_value_split(int d_v, int features) {
  if (softcap_beside_score_changes(features)) return 0;
  if ((features & (FEATURE_ALIBI | FEATURE_ATTN_MASK)) != 0) {
    for (int shares = 2; shares <= 4; ++shares)
      if (d_v % (8 * shares) == 0 && d_v / shares >= 16 && d_v / shares <= 40) return shares;
    return 0;
  }
  return d_v <= 64 ? 1 : d_v <= 128 ? 2 : 0;
}

}  // namespace

KernelVariant fwd_variant(const std::string& dtype, int head_dim, int head_dim_v, int features,
                          const DeviceLimits& limits, const std::string& mode) {
  if (head_dim_v <= 0) head_dim_v = head_dim;
  const int widest = std::max(head_dim, head_dim_v);
  const int d = padded_head_dim(head_dim), d_v = padded_head_dim(head_dim_v);
  // FP8 caches (kv_quant.hpp) take the matrix kernel too, its K/V pack converting them to T,
  // where the decode kernel serves their decodes (fp8_decode). Elsewhere (DG2, Arrow Lake-H)
  // decodes come here, and the pack would write the whole cache at twice its size per step.
  const bool fp8 = (features & FEATURE_KV_FP8) != 0;
  MatrixTile tile = fp8 && !limits.fp8_decode
                        ? MatrixTile{}
                        : matrix_tile(limits, dtype, padded_head_dim(widest), mode);
  // With D != Dv the register kernel runs S = Q K^T at D and P.V, O at Dv. What must fit is
  // O^T's resident accumulators, at Dv (up to 128 as with D = Dv); Q^T above d = 64 is read from
  // SLM per block, so D adds no resident registers (up to the largest head dim, 256).
  const int eight_wide_split = eight_wide_value_split(d_v, features);
  const int max_8_wide = eight_wide_split > 0 ? 128 : 0;
  const bool split = d != d_v && matrix_tiles_in_registers(tile, limits, d_v, 128, max_8_wide);
  const bool registers =
      split || matrix_tiles_in_registers(tile, limits, padded_head_dim(widest), 128, max_8_wide);
  // Deeper reduction steps (AMX's shape, emulated) where both head dims take them.
  if (split && (d % tile.k != 0 || d_v % tile.k != 0)) tile.k = 16;
  // The vector kernel compiles V's head dim apart wherever the two pad differently.
  const bool vector_split = tile.m == 0 && d != d_v;
  const SlmBytes vector_slm = [&](int hd, int bm, int bn) {
    return fwd_slm_bytes(hd, vector_split ? d_v : hd, bm, bn);
  };
  const int value_split = registers && tile.n == 8 ? eight_wide_split : 1;
  const SlmBytes registers_slm = [&](int hd, int bm, int bn) {
    return value_split * fwd_matrix_registers_slm_bytes(hd, bm, bn);  // Q^T per share
  };
  KernelVariant variant = choose_variant(
      dtype, split || vector_split ? head_dim : widest, limits,
      registers ? registers_slm : tile.m > 0 ? fwd_matrix_slm_bytes : vector_slm);
  variant.value_split = value_split;
  if (split || vector_split) variant.head_dim_v = d_v;
  // The 8-wide engines' 128 registers hold O^T (64 at d = 64) beside the S^T and P of 16 keys;
  // with 32 keys they spilled 6-7 KB per thread (DG2).
  if (registers && tile.n == 8) variant.block_n = 16;
  variant.matrix_registers = registers;
  variant.matrix_m = tile.m;
  variant.matrix_k = tile.k;
  variant.matrix_emulated = tile.emulated;
  variant.matrix_n = tile.n;
  variant.features = features;
  return variant;
}

KernelProgram fwd_program(const KernelVariant& variant) {
  if (variant.matrix_m > 0)
    return {variant.matrix_registers ? "programs/flash_fwd_matrix_registers.hpp" : "programs/flash_fwd_matrix.hpp",
            {variant.matrix_registers
                 ? with_trailing(
                       variant.instantiate("ipex_flash::flash_fwd_matrix_registers_kernel"),
                       {variant.value_head_dim(), variant.value_split})
                 : variant.instantiate("ipex_flash::flash_fwd_matrix_kernel"),
             "ipex_flash::flash_fwd_pack_kv_kernel<" + device_type_name(variant.dtype) + ", " +
                 std::to_string(variant.head_dim) + ", " + std::to_string(variant.block_n) +
                 ", " + std::to_string(variant.features & FEATURE_KV_FP8) + ", " +
                 std::to_string(variant.value_head_dim()) + pack_tile_order(variant) + ">"},
            program_options(variant)};
  return {"programs/flash_fwd.hpp",
          {with_trailing(variant.instantiate("ipex_flash::flash_fwd_kernel"),
                         {variant.value_head_dim()})},
          program_options(variant)};
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
    const int64_t needed = packed_kv_bytes(c.dims, params.kv_pack, variant);
    const int64_t given = scratch.sizes.empty() ? 0 : scratch.size(0);
    if (scratch.dtype != "uint8" || given < needed)
      throw std::invalid_argument("ipex_flash: flash_fwd scratch must be a uint8 tensor of at least " +
                                  std::to_string(needed) + " bytes (fwd_scratch_bytes), got " +
                                  std::to_string(given) + " " + scratch.dtype);
    params.kv_packed = reinterpret_cast<void*>(scratch.data);
    if (params.kv_pack.blocks > 0)  // none: no sequence has a key to read
      submit_kernel(queue, kernels[1], params,
                    block_range(c.dims.heads_kv(), params.kv_pack.blocks, variant.block_n),
                    "flash_fwd_pack_kv");  // the queue is in order: done before the next launch
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
  return packed_kv_bytes(dims, key_pack_rows(dims, k, options, variant.block_n), variant);
}

KernelVariant warmup_fwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  const KernelVariant variant = fwd_variant_on(queue, dtype, head_dim, head_dim, 0);
  get_kernels(queue, fwd_program(variant));
  return variant;
}

}  // namespace ipex_flash
