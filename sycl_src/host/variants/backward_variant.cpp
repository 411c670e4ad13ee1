#include "host/variants/backward_variant.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "host/variants/matrix_engine.hpp"
#include "device/backward/params.hpp"
#include "device/matrix/pack_rows.hpp"

namespace ipex_flash {
namespace {

size_t bwd_slm_bytes(int head_dim, int block_m, int block_n) {
  const size_t d = head_dim, m = block_m, n = block_n;
  // dQ kernel: Q, dO, dQ (d, q) and K, V (kv, d). dK/dV kernel: K, V, dK, dV (d, kv),
  // Q, dO (q, d) and two per-row scalars. One variant serves both kernels.
  const size_t dq = 3 * d * m + 2 * n * d;
  const size_t dkdv = 4 * d * n + 2 * m * d + 2 * m;
  return sizeof(float) * std::max(dq, dkdv);
}

size_t bwd_matrix_slm_bytes(int head_dim, int block_m, int block_n) {
  // dK/dV kernel: S^T and dP^T (kv, q) in float32, P^T and dS^T (kv, q) in the 16-bit dtype,
  // the dK and dV accumulators (kv, d) in float32. dQ kernel: S^T, dP^T, dS^T packed and the
  // dQ^T accumulator (d, q). Both: one float for any_visible, which IGC places in 32 bytes.
  // Operands read from global memory (backward/pack_operands.hpp) take none.
  const size_t d = head_dim, m = block_m, n = block_n;
  const size_t dkdv = 4 * 2 * n * m + 2 * 2 * n * m + 4 * 2 * n * d;
  const size_t dq = 4 * 2 * n * m + 2 * n * m + 4 * d * m;
  return std::max(dkdv, dq) + 32;
}

}  // namespace

namespace {

// Sub-groups sharing a block's head dims on the 8-wide engines past d = 64: the fewest that give
// each whole 8-row tiles, at most four of them (32 rows: a resident accumulator of 32 registers,
// as at d = 64 with two). Each computes the block's scores again
// (backward/dq_registers_kernel.hpp).
int eight_wide_shares_past_64(int head_dim) {
  const int tiles = head_dim / 8;
  int shares = 2;
  while (tiles % shares != 0 || tiles / shares > 4) ++shares;
  return shares;
}

}  // namespace

BwdShares bwd_shares(const KernelVariant& variant) {
  if (variant.matrix_n != 8) return {1, 1};
  const int d = variant.head_dim;
  const int wide = d > 64 ? eight_wide_shares_past_64(d) : 2;
  return {variant.matrix_registers && d >= 32 ? wide : 1,
          variant.dkdv_registers && d > 32 ? wide : 1};
}

KernelVariant bwd_variant(const std::string& dtype, int head_dim, int features,
                          const DeviceLimits& limits, const std::string& mode,
                          SkipReasons* why) {
  MatrixTile tile = matrix_tile(limits, dtype, padded_head_dim(head_dim), mode, why);
  if ((features & FEATURE_ATTN_MASK) != 0 && !tile.emulated && !limits.matrix_masked_backward) {
    if (why && tile.m > 0)
      why->push_back("attn_mask on " + limits.name + ": its compiler cannot build the masked " +
                     "matrix backward (device_limits.hpp, matrix_masked_backward)");
    tile = MatrixTile{};
  }
  // Past what the device's local memory fits (the vector kernels' float32 tiles: head dims up
  // to 320 in 128 KiB, 160 in 64 KiB; the matrix kernels': 576 and 480), an error naming the
  // head dim, the device and its limit: the backward has no form with smaller tiles.
  KernelVariant variant = choose_variant(dtype, head_dim, limits,
                                         tile.m > 0 ? bwd_matrix_slm_bytes : bwd_slm_bytes,
                                         TileBounds{"backward kernel"});
  variant.features = features;
  variant.matrix_m = tile.m;
  variant.matrix_emulated = tile.emulated;
  variant.matrix_n = tile.n;
  // dQ's resident accumulator (dQ^T) takes HEAD_DIM / 8 x 8 registers: 128 at d = 128 beside
  // dQ's score slabs. On the 8-wide engines, whose file is 128 registers, up to d = 128, two or
  // more sub-groups per rows (bwd_shares). dK/dV's two (dK^T, dV^T) would take all 256 there:
  // past d = 64 that kernel holds one at a time, walking the query rows twice
  // (backward/dkdv_registers_kernel.hpp), as it does past d = 32 on the 8-wide engines, up to
  // 128 with its own sub-groups. The register kernels take softcap's short tanh with every score
  // change (backward/score_grads.hpp). On the 8-wide engines softcap with a float mask past
  // d = 64 keeps the SLM-staged dK/dV: there the register kernel keeps one loop over the query
  // blocks (score/block_mask.hpp, split_blocks), in which it spilled (16 accesses, DG2 and Arrow
  // Lake-H). With softcap beside ALiBi or a bool mask, and a float mask up to 64, its blocks split
  // and its spills stay out of its loops (gpu-check; docs/gpu_loop_costs.md). The register dQ
  // reads either layout of the packs; the SLM-staged dQ only its own, so never beside the
  // register dK/dV.
  variant.matrix_registers = matrix_tiles_in_registers(tile, limits, variant.head_dim, 128, 128,
                                                       why, "the register backward (dQ, dK/dV)");
  const bool dkdv_staged_8_wide =
      tile.n == 8 && softcap_beside_wide_float_mask(variant.head_dim, features);
  variant.dkdv_registers = variant.matrix_registers && !dkdv_staged_8_wide;
  if (why && variant.matrix_registers && dkdv_staged_8_wide)
    why->push_back("softcap with a float mask at head dim " + std::to_string(variant.head_dim) +
                   " > 64: on 8-wide matrix engines the register dK/dV keeps one loop there and "
                   "would spill in it (docs/gpus.md); dK/dV staged through SLM, dQ in "
                   "registers");
  // The products reduce over head dims, query rows and keys: 32-deep steps need all three.
  const bool deep = variant.block_m % 32 == 0 && variant.block_n % 32 == 0;
  variant.matrix_k = deep ? tile.k : std::min(tile.k, 16);
  return variant;
}

bool bwd_mask_bits(const KernelVariant& variant) {
  return variant.matrix_m > 0 && (variant.matrix_registers || variant.dkdv_registers) &&
         (variant.features & FEATURE_MASK_BOOL) != 0;
}

KernelProgram bwd_program(const KernelVariant& variant) {
  const std::string type = device_type_name(variant.dtype);
  const std::string preprocess = "ipex_flash::flash_bwd_preprocess_kernel<" + type + ">";
  if (variant.matrix_m > 0) {
    const std::string shape = "<" + type + ", " + std::to_string(variant.head_dim) + ", " +
                              std::to_string(variant.block_m) + ", " +
                              std::to_string(variant.block_n) + ">";
    // Each main kernel keeps its tiles in registers where its head dims allow (dQ over a wider
    // range than dK/dV); the packs take the dK/dV kernel's layout, and the register dQ kernel
    // reads either. The header of the widest program includes the rest of it.
    const bool dkdv_registers = variant.dkdv_registers, dq_registers = variant.matrix_registers;
    const std::string layout = dkdv_registers ? ", true" : ", false";
    // The pack's order (matrix/pack_rows.hpp, bwd_pack_tiled): tile by tile, or row-major (0, 0).
    const bool tiled = bwd_pack_tiled(variant.head_dim, variant.matrix_n);
    const std::string pack_shape = with_trailing(shape, layout + variant.tile_order(tiled));
    const BwdShares shares = bwd_shares(variant);
    std::string dq = variant.instantiate(dq_registers
                                             ? "ipex_flash::flash_bwd_dq_matrix_registers_kernel"
                                             : "ipex_flash::flash_bwd_dq_matrix_kernel");
    if (dq_registers) dq = with_trailing(with_trailing(dq, layout), {shares.dq});
    std::string dkdv = variant.instantiate(dkdv_registers
                                               ? "ipex_flash::flash_bwd_dkdv_matrix_registers_kernel"
                                               : "ipex_flash::flash_bwd_dkdv_matrix_kernel");
    if (dkdv_registers) dkdv = with_trailing(dkdv, {shares.dkdv});
    std::vector<std::string> kernels{preprocess,
                                     "ipex_flash::flash_bwd_pack_keys_kernel" + pack_shape,
                                     "ipex_flash::flash_bwd_pack_rows_kernel" + pack_shape, dkdv,
                                     dq};
    if (bwd_mask_bits(variant)) kernels.push_back("ipex_flash::flash_mask_bits_kernel");
    return {dkdv_registers ? "programs/flash_bwd_dkdv_registers.hpp"
            : dq_registers ? "programs/flash_bwd_dq_registers.hpp"
                           : "programs/flash_bwd_matrix.hpp",
            kernels, program_options(variant)};
  }
  return {"programs/flash_bwd.hpp",
          {preprocess, variant.instantiate("ipex_flash::flash_bwd_dkdv_kernel"),
           variant.instantiate("ipex_flash::flash_bwd_dq_kernel")},
          program_options(variant)};
}

}  // namespace ipex_flash
