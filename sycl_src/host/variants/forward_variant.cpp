#include "host/variants/forward_variant.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "host/variants/matrix_engine.hpp"
#include "device/forward/params.hpp"

namespace ipex_flash {
namespace {

// The fewest keys per block (choose_variant's): the vector kernels' two register chunks of 8,
// the slab kernel's one chunk of FWD_KEY_CHUNK (forward/vector_kernel.hpp).
constexpr int kSmallestKeyBlock = 16;

size_t fwd_slm_bytes(int head_dim, int head_dim_v, int block_m, int block_n) {
  // Q (d, q) and the output accumulator (dv, q), K (kv, d) and V (kv, dv) tiles, all float32.
  return sizeof(float) * (static_cast<size_t>(head_dim + head_dim_v) * block_m +
                          static_cast<size_t>(block_n) * (head_dim + head_dim_v));
}

// The vector forward walking K and V in slabs of kv_cols columns (flash_fwd_slab_kernel): Q
// (d, q) and the output accumulator (dv, q) as above, and one slab of K's and one of V's block
// (kv, kv_cols), all float32.
size_t fwd_slab_slm_bytes(int head_dim, int head_dim_v, int kv_cols, int block_m, int block_n) {
  return sizeof(float) * (static_cast<size_t>(head_dim + head_dim_v) * block_m +
                          2 * static_cast<size_t>(block_n) * kv_cols);
}

// The slabs' width: the widest of 128, 64, 32 and 16 columns that divides both padded head dims
// (multiples of 32 past 128), so that every slab is whole.
int fwd_slab_cols(int d, int d_v) {
  for (int cols : {128, 64, 32})
    if (d % cols == 0 && d_v % cols == 0) return cols;
  return 16;
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

// The pack's order (forward/pack_kv.hpp, matrix/surface.hpp): tile by tile for the 8-wide
// register kernel, which reads its A tiles without 2-D block loads; row-major (0, 0) otherwise.
std::string pack_tile_order(const KernelVariant& variant) {
  return variant.tile_order(variant.matrix_registers && variant.matrix_n == 8);
}

// The register forward's sub-groups per query rows on the 8-wide engines (DG2, Arrow Lake-H:
// 128 registers of 32 bytes, a sub-group's O^T taking d_v of them), each holding its share of
// O^T (VALUE_SPLIT, forward/registers_kernel.hpp); 0 where they keep the SLM-staged kernel.
// One up to d_v = 64, two up to 128 (a whole O^T filled the registers). With ALiBi or a user's
// mask, the fewest (two to four) whose shares are whole tiles, two at least (an array of one
// tile made IGC drop the work), and at most 40 rows of O^T: two from 32 to 80, three at 96,
// four at 128; none at 16 and 112. Beside a whole O^T at d = 64, or 56 rows at 112, their
// per-score work would spill the 128 registers (gpu-check's record, docs/gpus.md).
// Softcap alone counts as no change: its fused tanh (score/softcap_alibi.hpp) needs no register
// per score; beside ALiBi or a mask it takes their shares, without spilling (gpu-check: 24-42
// instructions per DPAS, where the SLM-staged kernel issued 152-199), but for a float mask past
// d = 64 (`widest`, the larger padded head dim: softcap_beside_wide_float_mask), where the
// kernel keeps one loop and sycl::tanh (forward/registers_kernel.hpp, FLOAT_MASK_WIDE): 171-188
// per DPAS there, above the SLM-staged kernel's 162-169+, and beside ALiBi it spilled 1.6 KB.

int eight_wide_value_split(int d_v, int widest, int features) {
  if (softcap_beside_wide_float_mask(widest, features)) return 0;
  if ((features & (FEATURE_ALIBI | FEATURE_ATTN_MASK)) != 0) {
    for (int shares = 2; shares <= 4; ++shares)
      if (d_v % (8 * shares) == 0 && d_v / shares >= 16 && d_v / shares <= 40) return shares;
    return 0;
  }
  return d_v <= 64 ? 1 : d_v <= 128 ? 2 : 0;
}

// Why eight_wide_value_split gives 0 for (d_v, widest, features).
std::string no_eight_wide_reason(int d_v, int widest, int features) {
  const std::string on_8_wide = "on 8-wide matrix engines the register forward ";
  if (softcap_beside_wide_float_mask(widest, features))
    return "softcap with a float mask at head dim " + std::to_string(widest) + " > 64: " +
           on_8_wide + "keeps one loop with sycl::tanh there, and would spill the 128 " +
           "registers beside ALiBi (docs/gpus.md)";
  if ((features & (FEATURE_ALIBI | FEATURE_ATTN_MASK)) != 0)
    return "ALiBi or a mask at value head dim " + std::to_string(d_v) + ": " + on_8_wide +
           "needs O split into 2-4 whole-tile shares of 16-40 columns";
  return "value head dim " + std::to_string(d_v) + " > 128: " + on_8_wide +
         "takes head dims up to 128";
}

}  // namespace

KernelVariant fwd_variant(const std::string& dtype, int head_dim, int head_dim_v, int features,
                          const DeviceLimits& limits, const std::string& mode,
                          SkipReasons* why) {
  if (head_dim_v <= 0) head_dim_v = head_dim;
  if (head_dim_v > kMaxHeadDim)
    throw std::invalid_argument("ipex_flash: v's head dim must be in [1, " +
                                std::to_string(kMaxHeadDim) + "], got " +
                                std::to_string(head_dim_v));
  const int widest = std::max(head_dim, head_dim_v);
  const int d = padded_head_dim(head_dim), d_v = padded_head_dim(head_dim_v);
  // FP8 caches (common/kv_quant.hpp) take the matrix kernel too, its K/V pack converting them to T,
  // where the decode kernel serves their decodes (fp8_decode). Elsewhere (DG2, Arrow Lake-H)
  // decodes come here, and the pack would write the whole cache at twice its size per step.
  const bool fp8 = (features & FEATURE_KV_FP8) != 0;
  if (fp8 && !limits.fp8_decode && why)
    why->push_back("FP8 K/V cache on " + limits.name + ", whose decodes take this kernel: " +
                   "the matrix form's K/V pack would rewrite the cache at twice its size per step");
  MatrixTile tile = fp8 && !limits.fp8_decode
                        ? MatrixTile{}
                        : matrix_tile(limits, dtype, padded_head_dim(widest), mode, why);
  // With D != Dv the register kernel runs S = Q K^T at D and P.V, O at Dv. What must fit is
  // O^T's resident accumulators, at Dv (up to 128 as with D = Dv); Q^T above d = 64 is read from
  // SLM per block, so D adds no resident registers: gpu-check's record has it up to D = 256,
  // and past that the SLM-staged kernel serves it.
  const int eight_wide_split = eight_wide_value_split(d_v, std::max(d, d_v), features);
  const int max_8_wide = eight_wide_split > 0 ? 128 : 0;
  const std::string no_8_wide = why && eight_wide_split == 0
                                    ? no_eight_wide_reason(d_v, std::max(d, d_v), features)
                                    : std::string();
  constexpr int kMaxSplitHeadDim = 256;
  // (The reasons from the call that decides: at Dv where the head dims differ.)
  const bool split_fits = d != d_v && matrix_tiles_in_registers(tile, limits, d_v, 128,
                                                                max_8_wide, why,
                                                                "the register forward", no_8_wide);
  if (split_fits && d > kMaxSplitHeadDim && why)
    why->push_back("head dim " + std::to_string(d) + " > " + std::to_string(kMaxSplitHeadDim) +
                   " (v's " + std::to_string(d_v) + "): the register forward with V's head " +
                   "dim apart is checked up to " + std::to_string(kMaxSplitHeadDim));
  const bool split = split_fits && d <= kMaxSplitHeadDim;
  const bool registers =
      split || matrix_tiles_in_registers(tile, limits, padded_head_dim(widest), 128, max_8_wide,
                                         d == d_v ? why : nullptr, "the register forward",
                                         no_8_wide);
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
  const int kernel_head_dim = split || vector_split ? head_dim : widest;
  const TileBounds bounds{"forward kernel"};
  // The vector kernel holds whole K and V rows where its smallest tiles fit them, else walks
  // them in slabs, with as few as 8 query rows: Q and the output accumulator alone, 16 rows of
  // 576 + 512 float32 columns, would fill the 64 KiB of Arc A-series, Meteor Lake and Arrow
  // Lake-H (and whole rows at 576 + 512 outgrow 128 KiB).
  const int vector_d = padded_head_dim(kernel_head_dim);
  const size_t whole_rows_slm = vector_slm(vector_d, bounds.min_block_m, kSmallestKeyBlock);
  const bool slabs = tile.m == 0 && whole_rows_slm > limits.local_mem_bytes;
  const int kv_cols = slabs ? fwd_slab_cols(vector_d, vector_split ? d_v : vector_d) : 0;
  if (slabs && why)
    why->push_back("head dim " + std::to_string(vector_d) +
                   (vector_split ? ", v's " + std::to_string(d_v) : std::string()) +
                   ": the vector forward's whole K and V rows need " +
                   std::to_string(whole_rows_slm) +
                   " bytes of local memory at its smallest tiles, " + limits.name + " has " +
                   std::to_string(limits.local_mem_bytes) + ": K and V go through it " +
                   std::to_string(kv_cols) + " columns at a time");
  const SlmBytes slab_slm = [&](int hd, int bm, int bn) {
    return fwd_slab_slm_bytes(hd, vector_split ? d_v : hd, kv_cols, bm, bn);
  };
  KernelVariant variant =
      slabs ? choose_variant(dtype, kernel_head_dim, limits, slab_slm,
                             TileBounds{"forward kernel", /*min_block_m=*/8,
                                        /*max_block_n=*/kSmallestKeyBlock})
            : choose_variant(dtype, kernel_head_dim, limits,
                             registers    ? registers_slm
                             : tile.m > 0 ? SlmBytes(fwd_matrix_slm_bytes)
                                          : vector_slm,
                             bounds);
  variant.kv_cols = kv_cols;
  variant.value_split = value_split;
  if (split || vector_split) variant.head_dim_v = d_v;
  // The 8-wide engines' 128 registers hold O^T (64 at d = 64) beside the S^T and P of 16 keys;
  // 32 keys would spill on DG2 and Arrow Lake-H (gpu-check's record, docs/gpus.md).
  if (registers && tile.n == 8) variant.block_n = 16;
  variant.matrix_registers = registers;
  variant.matrix_m = tile.m;
  variant.matrix_k = tile.k;
  variant.matrix_emulated = tile.emulated;
  variant.matrix_n = tile.n;
  variant.features = features;
  return variant;
}

bool fwd_mask_bits(const KernelVariant& variant) {
  return variant.matrix_m > 0 && variant.matrix_registers &&
         (variant.features & FEATURE_MASK_BOOL) != 0;
}

KernelProgram fwd_program(const KernelVariant& variant) {
  if (variant.matrix_m > 0) {
    KernelProgram program{
        variant.matrix_registers ? "programs/flash_fwd_matrix_registers.hpp"
                                 : "programs/flash_fwd_matrix.hpp",
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
    if (fwd_mask_bits(variant)) program.kernels.push_back("ipex_flash::flash_mask_bits_kernel");
    return program;
  }
  return {"programs/flash_fwd.hpp",
          {variant.kv_cols > 0
               ? with_trailing(variant.instantiate("ipex_flash::flash_fwd_slab_kernel"),
                               {variant.value_head_dim(), variant.kv_cols})
               : with_trailing(variant.instantiate("ipex_flash::flash_fwd_kernel"),
                               {variant.value_head_dim()})},
          program_options(variant)};
}

}  // namespace ipex_flash
