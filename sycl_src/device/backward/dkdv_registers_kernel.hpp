// The backward's dK/dV kernel with its tiles in registers, for the GPUs and emulation that run
// the dQ kernel so (backward/dq_registers_kernel.hpp; programs/flash_bwd_dkdv_registers.hpp builds
// both).
// Here a lane owns a key, its column of every tile (matrix/registers.hpp), and each sub-group
// its MATRIX_N keys of the work-group's block (or its share of their head dims: SHARES, the
// 8-wide engines past d = 32): sub-groups share nothing (each votes on the mask alone,
// AttnMaskPlane::hides_lines).
// Per query block, MATRIX_K rows (a slab) at a time, in this order (legend as in
// backward/matrix_kernels.hpp):
//   S (r, kv)  = Q (r, d) . K^T (d, kv)         SLAB / MATRIX_M accumulators
//   P (r, kv)                                   each lane on its key's column, a B operand
//   dV^T (d, kv) += dO^T (d, r) . P (r, kv)     HEAD_DIM / MATRIX_M accumulators, resident
//   dP (r, kv) = dO (r, d) . V^T (d, kv)        SLAB / MATRIX_M accumulators
//   dS (r, kv)                                  from P and dP, a B operand
//   dK^T (d, kv) += Q^T (d, r) . dS (r, kv)     HEAD_DIM / MATRIX_M accumulators, resident
// (backward/column_grads.hpp). Up to d = 64 in one walk over the rows; past it dK^T and dV^T would
// take all 256 registers (128 each at d = 128), so the kernel walks the rows twice: S, P and dV
// with dV^T resident, then dP, S, P, dS and dK with dK^T resident (dkdv_register_rows).
// Q, dO, Q^T and dO^T are read by coordinates within their block of the packed copy, K^T and V^T
// as B tiles from theirs (backward/pack_operands.hpp, REGISTERS); the A operands in 2-D blocks of
// four DPAS (matrix/block_io.hpp: a load per tile cost its descriptor every DPAS), or on the
// 8-wide engines (DG2, Arrow Lake-H, up to d = 128), which have no 2-D block loads, a tile per
// load from packs in tile order. The rows' LSE and delta are loaded one per lane and broadcast from
// the lane that holds them. Deterministic, no atomics.
#pragma once

#include <sycl/sycl.hpp>

#include "backward/dkdv_register_rows.hpp"
#include "backward/pack_operands.hpp"
#include "backward/params.hpp"
#include "common/kernel_props.hpp"
#include "common/params.hpp"

namespace ipex_flash {

// SHARES sub-groups per MATRIX_N keys (the host's bwd_shares: on the 8-wide engines two past
// d = 32, and past d = 64 enough for at most 32 rows each; else one), each holding its
// HEAD_DIM / SHARES rows (head dims) of dK^T and dV^T and computing the keys' S, P, dP and dS
// alike (the same arithmetic: the same results). The work-group is BLOCK_N x SHARES work-items.
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N, int SHARES>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<MATRIX_N>))
IPEX_FLASH_REGISTER_FILE
void flash_bwd_dkdv_matrix_registers_kernel(BwdParams p) {
  constexpr int M = MATRIX_M, K = MATRIX_K, N = MATRIX_N;
  constexpr int SHARE_ROWS = HEAD_DIM / SHARES, ACC_TILES = SHARE_ROWS / M;
  // dK^T and dV^T take SHARE_ROWS / M x M registers each (fp32, a register per row of N
  // lanes): at d = 128 on the 16-wide engines, 128 each, the whole register file together. Past
  // d = 64 there (past 16 on the 8-wide engines, whose file is 128 registers of 32 bytes: at
  // d = 32, 32 each beside the slab's columns spilled on DG2: gpu-check's record) the kernel
  // walks the query rows twice, dV first, then dK, with one of them resident at a time: S and P
  // are computed twice (a quarter more products), where holding both would spill.
  constexpr bool TWO_PASSES = SHARE_ROWS > (N == 8 ? 16 : 64);
  static_assert(bwd_matrix_shape<HEAD_DIM, BLOCK_M, BLOCK_N, MATRIX_M, MATRIX_K, MATRIX_N>() &&
                    BLOCK_M % K == 0 && BLOCK_N % N == 0 && K % MATRIX_KEY_CHUNK == 0 &&
                    K % N == 0 && SHARE_ROWS % M == 0,
                "tile shape: a slab of rows is whole parts of the lanes' statistics, a share "
                "whole tiles");

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto sg = item.get_sub_group();
  const int item_id = static_cast<int>(item.get_local_id(0));
  const int lid = SHARES == 1 ? item_id : item_id % BLOCK_N;  // the key's in the block
  const int share = SHARES == 1 ? 0 : item_id / BLOCK_N;
  const int d0 = share * SHARE_ROWS;  // the share's first head dim
  // The sub-group's first key within the block, broadcast from lane 0: IGC then knows it is
  // the same in every lane (lid minus the lane's index it did not, and held the K^T and V^T
  // tile pointers below per lane, 64-bit, through both passes: they spilled).
  const int key0 = sycl::group_broadcast(sg, lid, 0);
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), c.num_blocks,
                                       c.dims.heads_kv(), /*reverse_blocks=*/false);
  const int b = coord.batch, h_kv = coord.head;
  const SeqInfo seq = seq_info(c, b);
  const int64_t kv_begin = static_cast<int64_t>(coord.block) * BLOCK_N;
  if (kv_begin >= seq.len_k) return;  // the whole work-group leaves together
  const int64_t kv_end = std::min<int64_t>(kv_begin + BLOCK_N, seq.len_k);
  using Packed = PackedBwdFor<T, HEAD_DIM, BLOCK_M, BLOCK_N, /*REGISTERS=*/true, M, K, N>;
  const typename Packed::Keys keys = Packed::keys(p, b, h_kv, coord.block);
  // What the stores at the end need, taken from the parameters now: kept instead, the
  // parameter block spilled beside the resident accumulators (BMG, softcap + ALiBi + mask).
  const struct {
    T *dk, *dv;
    int64_t dk_row, dv_row;
    float scale;
    int head_dim, head_dim_v, keys;  // keys: how many of the block's keys are in the sequence
  } out{static_cast<T*>(p.dk) + b * p.dk_stride.batch + h_kv * p.dk_stride.head +
            (seq.k_row0 + kv_begin) * p.dk_stride.row + d0,
        static_cast<T*>(p.dv) + b * p.dv_stride.batch + h_kv * p.dv_stride.head +
            (seq.k_row0 + kv_begin) * p.dv_stride.row + d0,
        p.dk_stride.row, p.dv_stride.row, c.scale, c.dims.head_dim - d0, c.dims.head_dim_v - d0,
        static_cast<int>(kv_end - kv_begin)};
  const BlockMask mask = BlockMask::of(c.mask, seq);
  const DkdvKeys kb{seq,
                    mask,
                    b,
                    h_kv,
                    kv_begin,
                    kv_end,
                    kv_begin + lid,
                    mask.first_row(kv_begin) / BLOCK_M * BLOCK_M,
                    mask.end_row(kv_end, seq.len_q),
                    Packed::key_columns(keys.k_t_pairs, key0),
                    Packed::key_columns(keys.v_t_pairs, key0),
                    d0};
  using Acc = MatrixAcc<M, N>;
  if constexpr (TWO_PASSES) {
    Acc grad[ACC_TILES];
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < ACC_TILES; ++t) matrix_fill(sg, grad[t], 0.f);
    dkdv_register_rows<T, HEAD_DIM, BLOCK_M, BLOCK_N, FEATURES, M, K, N, DKDV_DV>(sg, p, kb, grad,
                                                                                   grad);
    store_key_row<M>(sg, grad, out.dv + lid * out.dv_row, out.head_dim_v, 1.f, lid < out.keys);
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < ACC_TILES; ++t) matrix_fill(sg, grad[t], 0.f);
    dkdv_register_rows<T, HEAD_DIM, BLOCK_M, BLOCK_N, FEATURES, M, K, N, DKDV_DK>(sg, p, kb, grad,
                                                                                   grad);
    store_key_row<M>(sg, grad, out.dk + lid * out.dk_row, out.head_dim, out.scale, lid < out.keys);
  } else {
    Acc dk[ACC_TILES], dv[ACC_TILES];
IPEX_FLASH_TILE_LOOP
    for (int t = 0; t < ACC_TILES; ++t) {
      matrix_fill(sg, dk[t], 0.f);
      matrix_fill(sg, dv[t], 0.f);
    }
    dkdv_register_rows<T, HEAD_DIM, BLOCK_M, BLOCK_N, FEATURES, M, K, N, DKDV_BOTH>(sg, p, kb,
                                                                                     dk, dv);
    float dk_row[SHARE_ROWS], dv_row[SHARE_ROWS];
    lane_row_of_tiles<M>(sg, dk, dk_row);
    lane_row_of_tiles<M>(sg, dv, dv_row);
    if (lid >= out.keys) return;
    T* const dk_out = out.dk + lid * out.dk_row;
    T* const dv_out = out.dv + lid * out.dv_row;
IPEX_FLASH_TILE_LOOP
    for (int d = 0; d < SHARE_ROWS; ++d) {
      if (d < out.head_dim) dk_out[d] = from_float<T>(dk_row[d] * out.scale);
      if (d < out.head_dim_v) dv_out[d] = from_float<T>(dv_row[d]);
    }
  }
}

}  // namespace ipex_flash
