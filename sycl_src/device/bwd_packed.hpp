// The operands of the matrix backward (flash_bwd_matrix.hpp) in the order its products read
// them, written once per call by two small kernels, as the matrix forward packs K and V:
//   per (batch, K/V head, block of BLOCK_N keys):  K (kv, d), K^T (d, kv), V (kv, d)
//   per (batch, query head, block of BLOCK_M rows): Q^T and dO^T packed in pairs of head-dim
//     columns (B operands of S^T = K.Q^T and dP^T = V.dO^T), Q and dO packed in pairs of rows
//     (B operands of dK += dS^T.Q and dV += P^T.dO)
// all zero-padded to whole blocks and the compiled head dim, so the main kernels' tiles need no
// bounds checks and load straight from global memory (the 2-D block loads that feed XMX on
// GPUs). Each Q block would otherwise be transposed and packed again by every K/V block's
// work-group that reads it.
#pragma once

#include <sycl/sycl.hpp>

#include "block_schedule.hpp"
#include "params.hpp"
#include "seq_info.hpp"
#include "tile_io.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N>
struct PackedBwd {
  static constexpr int64_t KEY_BLOCK_ELEMENTS = 3 * BLOCK_N * HEAD_DIM;
  static constexpr int ROW_TILE_WORDS = BLOCK_M * HEAD_DIM / 2;  // one packed Q or dO tile
  static constexpr int64_t ROW_BLOCK_WORDS = 4 * ROW_TILE_WORDS;

  struct Keys {
    T* k;    // (BLOCK_N, HEAD_DIM)
    T* k_t;  // (HEAD_DIM, BLOCK_N)
    T* v;    // (BLOCK_N, HEAD_DIM)
  };
  struct Rows {
    uint32_t* q_t;       // words [HEAD_DIM / 2][BLOCK_M]
    uint32_t* do_t;      // words [HEAD_DIM / 2][BLOCK_M]
    uint32_t* q_pairs;   // words [BLOCK_M / 2][HEAD_DIM]
    uint32_t* do_pairs;  // words [BLOCK_M / 2][HEAD_DIM]
  };

  static inline int64_t key_region_elements(const BwdParams& p) {
    const AttentionDims& dims = p.common.dims;
    return static_cast<int64_t>(dims.batch) * dims.heads_kv() * p.kv_blocks * KEY_BLOCK_ELEMENTS;
  }

  static inline Keys keys(const BwdParams& p, int batch, int head_kv, int64_t block) {
    const int64_t index =
        (static_cast<int64_t>(batch) * p.common.dims.heads_kv() + head_kv) * p.kv_blocks + block;
    T* k = static_cast<T*>(p.packed) + index * KEY_BLOCK_ELEMENTS;
    return Keys{k, k + BLOCK_N * HEAD_DIM, k + 2 * BLOCK_N * HEAD_DIM};
  }

  static inline Rows rows(const BwdParams& p, int batch, int head, int64_t block) {
    const int64_t index =
        (static_cast<int64_t>(batch) * p.common.dims.heads_q + head) * p.q_blocks + block;
    uint32_t* base = reinterpret_cast<uint32_t*>(static_cast<T*>(p.packed) + key_region_elements(p)) +
                     index * ROW_BLOCK_WORDS;
    return Rows{base, base + ROW_TILE_WORDS, base + 2 * ROW_TILE_WORDS,
                base + 3 * ROW_TILE_WORDS};
  }
};

// One key block of PackedBwd::Keys per work-group of BLOCK_N work-items.
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void flash_bwd_pack_keys_kernel(BwdParams p) {
  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int lid = static_cast<int>(item.get_local_id(0));
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), p.kv_blocks,
                                       c.dims.heads_kv(), /*reverse_blocks=*/false);
  const SeqInfo seq = seq_info(c, coord.batch);
  const int64_t kv_begin = static_cast<int64_t>(coord.block) * BLOCK_N;
  const int rows = static_cast<int>(std::clamp<int64_t>(seq.len_k - kv_begin, 0, BLOCK_N));
  using Packed = PackedBwd<T, HEAD_DIM, BLOCK_M, BLOCK_N>;
  const typename Packed::Keys out = Packed::keys(p, coord.batch, coord.head, coord.block);
  const KvRows<T> k = kv_rows<T>(p.k, p.k_stride, c, seq, coord.batch, coord.head);
  const KvRows<T> v = kv_rows<T>(p.v, p.v_stride, c, seq, coord.batch, coord.head);
  using RowsTile = T[BLOCK_N][HEAD_DIM];
  load_tile<BLOCK_N, HEAD_DIM>(*reinterpret_cast<RowsTile*>(out.k), k, kv_begin, rows,
                               c.dims.head_dim, lid, BLOCK_N);
  load_tile_transposed<BLOCK_N, HEAD_DIM>(*reinterpret_cast<T(*)[HEAD_DIM][BLOCK_N]>(out.k_t), k,
                                          kv_begin, rows, c.dims.head_dim, lid, BLOCK_N);
  load_tile<BLOCK_N, HEAD_DIM>(*reinterpret_cast<RowsTile*>(out.v), v, kv_begin, rows,
                               c.dims.head_dim_v, lid, BLOCK_N);
}

// One query block of PackedBwd::Rows per work-group of BLOCK_M work-items.
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void flash_bwd_pack_rows_kernel(BwdParams p) {
  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int lid = static_cast<int>(item.get_local_id(0));
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), p.q_blocks,
                                       c.dims.heads_q, /*reverse_blocks=*/false);
  const SeqInfo seq = seq_info(c, coord.batch);
  const int64_t q_begin = static_cast<int64_t>(coord.block) * BLOCK_M;
  const int rows = static_cast<int>(std::clamp<int64_t>(seq.len_q - q_begin, 0, BLOCK_M));
  const int64_t row0 = seq.q_row0 + q_begin;
  const T* q = static_cast<const T*>(p.q) + coord.batch * p.q_stride.batch +
               coord.head * p.q_stride.head + row0 * p.q_stride.row;
  const T* dout = static_cast<const T*>(p.dout) + coord.batch * p.dout_stride.batch +
                  coord.head * p.dout_stride.head + row0 * p.dout_stride.row;
  using Packed = PackedBwd<T, HEAD_DIM, BLOCK_M, BLOCK_N>;
  const typename Packed::Rows out = Packed::rows(p, coord.batch, coord.head, coord.block);
  using ColumnPairs = uint32_t[HEAD_DIM / 2][BLOCK_M];
  using RowPairs = uint32_t[BLOCK_M / 2][HEAD_DIM];
  const int d = c.dims.head_dim, d_v = c.dims.head_dim_v;  // Q's, dO's columns
  load_tile_packed<BLOCK_M, HEAD_DIM>(*reinterpret_cast<ColumnPairs*>(out.q_t), q,
                                      p.q_stride.row, rows, d, lid, BLOCK_M);
  load_tile_packed<BLOCK_M, HEAD_DIM>(*reinterpret_cast<ColumnPairs*>(out.do_t), dout,
                                      p.dout_stride.row, rows, d_v, lid, BLOCK_M);
  load_tile_row_pairs<BLOCK_M, HEAD_DIM>(*reinterpret_cast<RowPairs*>(out.q_pairs), q,
                                         p.q_stride.row, rows, d, lid, BLOCK_M);
  load_tile_row_pairs<BLOCK_M, HEAD_DIM>(*reinterpret_cast<RowPairs*>(out.do_pairs), dout,
                                         p.dout_stride.row, rows, d_v, lid, BLOCK_M);
}

}  // namespace ipex_flash
