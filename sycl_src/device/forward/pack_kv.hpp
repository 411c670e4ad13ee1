// The forward matrix kernels' packed K/V copy (forward/matrix_kernel.hpp,
// forward/registers_kernel.hpp): every K/V block written once, before the main kernel, in the
// order its products read it: K (kv, d) and V^T (d, kv), zero-padded to whole blocks and the
// compiled head dim, one contiguous run per block, so that the main kernel loads its A tiles
// straight from global memory. Transposing V per work-group instead (64 times per K/V block at
// N = 4096) took a third of the kernel's time. FP8 caches (common/kv_quant.hpp) are converted to
// T here, exactly: every e4m3 and e5m2 value is a float16 and a bfloat16.
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>

#include "common/kv_quant.hpp"
#include "matrix/surface.hpp"
#include "matrix/pack_rows.hpp"
#include "common/params.hpp"
#include "forward/params.hpp"
#include "common/seq_info.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

// The packed K/V copy: per K/V head, each sequence's blocks from pack_first_block
// (matrix/pack_rows.hpp), each K (BLOCK_N x HEAD_DIM) followed by V^T (HEAD_DIM_V x BLOCK_N), in
// the input dtype, row-major or tile by tile (flash_fwd_pack_kv_kernel). HEAD_DIM_V is V's compiled
// head dim where the kernel runs it apart from Q's and K's (MLA: 192 and 128), so that V is not
// padded to HEAD_DIM.
template <typename T, int HEAD_DIM, int BLOCK_N, int HEAD_DIM_V = HEAD_DIM>
struct PackedKv {
  static constexpr int64_t BLOCK_ELEMENTS = static_cast<int64_t>(BLOCK_N) * (HEAD_DIM + HEAD_DIM_V);

  // K of block `blk` of (batch, head_kv); its V^T follows at + BLOCK_N * HEAD_DIM, and the
  // sequence's next block at + BLOCK_ELEMENTS. Readers take block 0 once, outside their loops
  // (the start reads cu_rows), and step from it.
  static inline T* block(const FwdParams& p, int batch, int head_kv, int64_t blk) {
    return static_cast<T*>(p.kv_packed) +
           pack_block_index<BLOCK_N>(p.kv_pack, batch, head_kv, blk) * BLOCK_ELEMENTS;
  }
};

// Writes one block of the packed K/V copy (PackedKv): K and V^T of BLOCK_N keys of one
// (batch, K/V head), zero past the sequence's end and the head dim. One work-group of BLOCK_N
// work-items per block of the pack, gaps included; the K/V rows may be packed (varlen) or
// paged like the forward's, in T or in the FP8 type of KV_FEATURES (FEATURE_KV_E4M3 / E5M2,
// else 0). TILE_M x TILE_K: the readers' A tiles where they read the copy tile by tile
// (matrix/surface.hpp: the 8-wide engines), 0 x 0 where they read it row by row.
template <typename T, int HEAD_DIM, int BLOCK_N, int KV_FEATURES, int HEAD_DIM_V, int TILE_M,
          int TILE_K>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void flash_fwd_pack_kv_kernel(FwdParams p) {
  using Order = SurfaceOrder<TILE_M, TILE_K>;
  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int lid = static_cast<int>(item.get_local_id(0));
  const PackedBlock coord =
      packed_block<BLOCK_N>(p.kv_pack, c.dims.batch, static_cast<int64_t>(item.get_group(0)));
  const int batch = coord.batch, head_kv = coord.head;
  const SeqInfo seq = seq_info(c, batch);
  const int64_t kv_begin = static_cast<int64_t>(coord.block) * BLOCK_N;
  const int rows = static_cast<int>(std::clamp<int64_t>(seq.len_k - kv_begin, 0, BLOCK_N));
  T* k_block = PackedKv<T, HEAD_DIM, BLOCK_N, HEAD_DIM_V>::block(p, batch, head_kv, coord.block);
  T* v_block = k_block + BLOCK_N * HEAD_DIM;
  using KV = kv_storage_t<T, KV_FEATURES>;
  using KTile = T[BLOCK_N][HEAD_DIM];
  using VTile = T[HEAD_DIM_V][BLOCK_N];
  // Tile by tile, the block goes through SLM in row-major order first (the loaders below
  // write rows), then out in the readers' order, each work-item writing consecutive elements.
  static syclexp::work_group_static<T[Order::TILED ? BLOCK_N * (HEAD_DIM + HEAD_DIM_V) : 1]>
      staged_slm;
  T* staged = Order::TILED ? static_cast<T*>(staged_slm) : k_block;
  load_tile<BLOCK_N, HEAD_DIM>(*reinterpret_cast<KTile*>(staged),
                               kv_rows<KV>(p.k, p.k_stride, c, seq, batch, head_kv), kv_begin,
                               rows, c.dims.head_dim, lid, BLOCK_N);
  load_tile_transposed<BLOCK_N, HEAD_DIM_V>(*reinterpret_cast<VTile*>(staged + BLOCK_N * HEAD_DIM),
                                          kv_rows<KV>(p.v, p.v_stride, c, seq, batch, head_kv),
                                          kv_begin, rows, c.dims.head_dim_v, lid, BLOCK_N);
  if constexpr (Order::TILED) {
    sycl::group_barrier(item.get_group());
    Order::copy_from_rows(k_block, staged, BLOCK_N, HEAD_DIM, lid, BLOCK_N);
    Order::copy_from_rows(v_block, staged + BLOCK_N * HEAD_DIM, HEAD_DIM_V, BLOCK_N, lid, BLOCK_N);
  }
}

}  // namespace ipex_flash
