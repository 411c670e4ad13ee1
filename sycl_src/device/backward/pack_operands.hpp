// The operands of the matrix backward in the order its products read them, written once per
// call by two small kernels, as the matrix forward packs K and V. Per (batch, K/V head, block of
// BLOCK_N keys): K (kv, d), K^T (d, kv), V (kv, d). Per (batch, query head, block of BLOCK_M
// rows): Q^T and dO^T packed in pairs of head-dim columns (B operands of S^T = K.Q^T and
// dP^T = V.dO^T in the dQ kernels), and
//   for the SLM-staged dK/dV kernel (backward/matrix_kernels.hpp): Q and dO packed in pairs of
//     rows (B operands of dK += dS^T.Q and dV += P^T.dO);
//   for the register one (backward/dkdv_registers_kernel.hpp, REGISTERS): Q, dO, Q^T and dO^T
//     plain (A operands of S = Q.K^T, dP = dO.V^T, dK^T += Q^T.dS, dV^T += dO^T.P), and per key
//     block K^T and V^T packed in pairs of head-dim rows (the B operands of S and dP).
// On the 8-wide engines up to head dim 128 (TILE_M x TILE_K: their A tiles, 8 x 16), which have
// no 2-D block loads, K, K^T and V (and for the register dK/dV kernel Q, dO, Q^T and dO^T) are
// stored tile by tile, and Q^T, dO^T, the row pairs of Q and dO, and K^T's and V^T's pairs with
// each sub-group's columns together (its TILE_M = MATRIX_N = 8 rows or keys), so that every
// tile a product reads is one contiguous block (matrix/surface.hpp); elsewhere (0 x 0) all are
// row-major.
// All are zero-padded to whole blocks and the compiled head dim, so the main kernels' tiles need
// no bounds checks and load straight from global memory (the 2-D block loads that feed XMX on
// GPUs). Each Q block would otherwise be transposed and packed again by every K/V block's
// work-group that reads it. Each head's key blocks, and its row blocks, run sequence after
// sequence from pack_first_block (matrix/pack_rows.hpp): packs of a packed batch (cu_seqlens)
// are sized by its real sequences.
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>

#include "matrix/surface.hpp"
#include "matrix/pack_rows.hpp"
#include "common/params.hpp"
#include "common/powers_of_two.hpp"
#include "backward/params.hpp"
#include "common/seq_info.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, bool REGISTERS = false,
          int TILE_M = 0, int TILE_K = 0>
struct PackedBwd {
  using Order = SurfaceOrder<TILE_M, TILE_K>;
  static constexpr bool TILED = Order::TILED;
  static_assert(!TILED || TILE_M == 8,
                "tile order: the 8-wide engines' A tiles, whose M is their sub-group's N");
  // Q^T's and dO^T's columns stored together (a sub-group's where tiled), and so the stride
  // of their packed rows in words; Q's and dO's in their row pairs; K^T's and V^T's pairs
  // (the register dK/dV kernel's B operands) likewise, a sub-group's keys together.
  static constexpr int COLUMN_GROUP = TILED ? TILE_M : BLOCK_M;
  static constexpr int PAIR_GROUP = TILED ? TILE_M : HEAD_DIM;
  static constexpr int KEY_GROUP = TILED ? TILE_M : BLOCK_N;
  static constexpr int KEY_TILES = REGISTERS ? 5 : 3, ROW_TILES = REGISTERS ? 6 : 4;
  static constexpr int64_t KEY_BLOCK_ELEMENTS = KEY_TILES * BLOCK_N * HEAD_DIM;
  static constexpr int KEY_TILE_WORDS = BLOCK_N * HEAD_DIM / 2;
  static constexpr int ROW_TILE_WORDS = BLOCK_M * HEAD_DIM / 2;  // one Q or dO tile
  static constexpr int64_t ROW_BLOCK_WORDS = ROW_TILES * ROW_TILE_WORDS;
  // Every tile at a multiple of its own bytes (bwd_pack_alignment, matrix/pack_rows.hpp): the
  // register kernels' OR-addressed surfaces. The host starts the pack so aligned.
  static constexpr bool OR_ADDRESSED =
      TILED && bwd_pack_alignment(HEAD_DIM, TILE_M, BLOCK_M, BLOCK_N) > 1;

  struct Keys {
    T* k;               // (BLOCK_N, HEAD_DIM), in Order
    T* k_t;             // (HEAD_DIM, BLOCK_N), in Order
    T* v;               // (BLOCK_N, HEAD_DIM), in Order
    uint32_t* k_t_pairs;  // words [BLOCK_N / KEY_GROUP][HEAD_DIM / 2][KEY_GROUP], REGISTERS only
    uint32_t* v_t_pairs;  // as k_t_pairs
  };
  struct Rows {
    uint32_t* q_t;       // words [BLOCK_M / COLUMN_GROUP][HEAD_DIM / 2][COLUMN_GROUP]
    uint32_t* do_t;      // as q_t
    uint32_t* q_pairs;   // words [HEAD_DIM / PAIR_GROUP][BLOCK_M / 2][PAIR_GROUP], SLM-staged only
    uint32_t* do_pairs;  // as q_pairs
    T* q;                // (BLOCK_M, HEAD_DIM), in Order, REGISTERS only
    T* dout;             // (BLOCK_M, HEAD_DIM), in Order, REGISTERS only
    T* q_cols;           // (HEAD_DIM, BLOCK_M): Q^T, in Order, REGISTERS only
    T* do_cols;          // (HEAD_DIM, BLOCK_M): dO^T, in Order, REGISTERS only
  };

  // Q^T's or dO^T's packed words from column r0 (a sub-group's first row) on, the B operand
  // of rows COLUMN_GROUP words apart; Q's or dO's row pairs from column d0 on, rows
  // PAIR_GROUP words apart.
  static inline const uint32_t* columns(const uint32_t* packed, int r0) {
    return in_groups<COLUMN_GROUP, HEAD_DIM / 2>(packed, r0);
  }
  static inline const uint32_t* pair_columns(const uint32_t* pairs, int d0) {
    return in_groups<PAIR_GROUP, BLOCK_M / 2>(pairs, d0);
  }
  // K^T's or V^T's packed words from key `key0` of the block on, rows KEY_GROUP words apart.
  static inline const uint32_t* key_columns(const uint32_t* pairs, int key0) {
    return in_groups<KEY_GROUP, HEAD_DIM / 2>(pairs, key0);
  }

  // Column `col` of words stored in groups of GROUP columns, each group ROWS rows of GROUP.
  template <int GROUP, int ROWS>
  static inline const uint32_t* in_groups(const uint32_t* words, int col) {
    if constexpr (TILED)
      return words + col / GROUP * (ROWS * GROUP) + col % GROUP;
    else
      return words + col;  // one group (dividing cost the kernels a few instructions: the
                           // compiler does not know the column is below the group's width)
  }

  // The key blocks' elements, rounded up to whole row tiles where tiles are OR-addressed (so
  // that the row tiles after them start at multiples of their bytes too).
  static inline int64_t key_region_elements(const BwdParams& p) {
    constexpr int64_t UNIT = OR_ADDRESSED ? int64_t{2} * ROW_TILE_WORDS : 1;
    return round_up_to(
        static_cast<int64_t>(p.common.dims.heads_kv()) * p.key_pack.blocks * KEY_BLOCK_ELEMENTS,
        UNIT);
  }

  // Pack index of the first key block of (batch, head_kv), and of the first row block of
  // (batch, head): readers take it once, outside their loops over blocks (it reads cu_rows),
  // and add the block.
  static inline int64_t first_key_block(const BwdParams& p, int batch, int head_kv) {
    return pack_block_index<BLOCK_N>(p.key_pack, batch, head_kv, 0);
  }
  static inline int64_t first_row_block(const BwdParams& p, int batch, int head) {
    return pack_block_index<BLOCK_M>(p.row_pack, batch, head, 0);
  }

  static inline Keys keys(const BwdParams& p, int batch, int head_kv, int64_t block) {
    return keys(p, first_key_block(p, batch, head_kv) + block);
  }
  static inline Keys keys(const BwdParams& p, int64_t index) {
    T* k = static_cast<T*>(p.packed) + index * KEY_BLOCK_ELEMENTS;
    uint32_t* pairs = reinterpret_cast<uint32_t*>(k + 3 * BLOCK_N * HEAD_DIM);
    return Keys{k, k + BLOCK_N * HEAD_DIM, k + 2 * BLOCK_N * HEAD_DIM,
                REGISTERS ? pairs : nullptr, REGISTERS ? pairs + KEY_TILE_WORDS : nullptr};
  }

  static inline Rows rows(const BwdParams& p, int batch, int head, int64_t block) {
    return rows(p, first_row_block(p, batch, head) + block);
  }
  static inline Rows rows(const BwdParams& p, int64_t index) {
    uint32_t* base = reinterpret_cast<uint32_t*>(static_cast<T*>(p.packed) + key_region_elements(p)) +
                     index * ROW_BLOCK_WORDS;
    uint32_t* tile[ROW_TILES];
#pragma unroll
    for (int i = 0; i < ROW_TILES; ++i) tile[i] = base + i * ROW_TILE_WORDS;
    if constexpr (REGISTERS)
      return Rows{tile[0], tile[1], nullptr, nullptr, reinterpret_cast<T*>(tile[2]),
                  reinterpret_cast<T*>(tile[3]), reinterpret_cast<T*>(tile[4]),
                  reinterpret_cast<T*>(tile[5])};
    else
      return Rows{tile[0], tile[1], tile[2], tile[3], nullptr, nullptr, nullptr, nullptr};
  }
};

// The pack the matrix kernels of tile shape M x K x N read (REGISTERS: with the register dK/dV
// kernel): in tile order where bwd_pack_tiled says (matrix/pack_rows.hpp), as their
// PackedSurface.
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, bool REGISTERS, int M, int K, int N>
using PackedBwdFor = PackedBwd<T, HEAD_DIM, BLOCK_M, BLOCK_N, REGISTERS,
                               bwd_pack_tiled(HEAD_DIM, N) ? M : 0,
                               bwd_pack_tiled(HEAD_DIM, N) ? K : 0>;

// One key block of PackedBwd::Keys per work-group of BLOCK_N work-items, over every block of
// the pack, gaps included (zeros).
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, bool REGISTERS, int TILE_M,
          int TILE_K>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void flash_bwd_pack_keys_kernel(BwdParams p) {
  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int lid = static_cast<int>(item.get_local_id(0));
  const PackedBlock coord =
      packed_block<BLOCK_N>(p.key_pack, c.dims.batch, static_cast<int64_t>(item.get_group(0)));
  const SeqInfo seq = seq_info(c, coord.batch);
  const int64_t kv_begin = static_cast<int64_t>(coord.block) * BLOCK_N;
  const int rows = static_cast<int>(std::clamp<int64_t>(seq.len_k - kv_begin, 0, BLOCK_N));
  using Packed = PackedBwd<T, HEAD_DIM, BLOCK_M, BLOCK_N, REGISTERS, TILE_M, TILE_K>;
  using Order = typename Packed::Order;
  const typename Packed::Keys out = Packed::keys(p, coord.batch, coord.head, coord.block);
  const KvRows<T> k = kv_rows<T>(p.k, p.k_stride, c, seq, coord.batch, coord.head);
  const KvRows<T> v = kv_rows<T>(p.v, p.v_stride, c, seq, coord.batch, coord.head);
  using RowsTile = T[BLOCK_N][HEAD_DIM];
  // Tile by tile, K, K^T and V go through SLM in row-major order first (the loaders write
  // rows), then out in the readers' order, as the forward's pack (forward/pack_kv.hpp).
  constexpr int TILE = BLOCK_N * HEAD_DIM;
  static syclexp::work_group_static<T[Order::TILED ? 3 * TILE : 1]> staged_slm;
  T* staged = Order::TILED ? static_cast<T*>(staged_slm) : out.k;  // out.k, k_t, v: in a row
  load_tile<BLOCK_N, HEAD_DIM>(*reinterpret_cast<RowsTile*>(staged), k, kv_begin, rows,
                               c.dims.head_dim, lid, BLOCK_N);
  load_tile_transposed<BLOCK_N, HEAD_DIM>(*reinterpret_cast<T(*)[HEAD_DIM][BLOCK_N]>(staged + TILE),
                                          k, kv_begin, rows, c.dims.head_dim, lid, BLOCK_N);
  load_tile<BLOCK_N, HEAD_DIM>(*reinterpret_cast<RowsTile*>(staged + 2 * TILE), v, kv_begin,
                               rows, c.dims.head_dim_v, lid, BLOCK_N);
  if constexpr (Order::TILED) {
    sycl::group_barrier(item.get_group());
    Order::copy_from_rows(out.k, staged, BLOCK_N, HEAD_DIM, lid, BLOCK_N);
    Order::copy_from_rows(out.k_t, staged + TILE, HEAD_DIM, BLOCK_N, lid, BLOCK_N);
    Order::copy_from_rows(out.v, staged + 2 * TILE, BLOCK_N, HEAD_DIM, lid, BLOCK_N);
  }
  if constexpr (REGISTERS) {  // the backward has no paged K/V: rows are contiguous
    constexpr int GROUP = Packed::KEY_GROUP;
    load_tile_packed<BLOCK_N, HEAD_DIM, GROUP>(out.k_t_pairs, k.row(kv_begin), k.row_stride,
                                               rows, c.dims.head_dim, lid, BLOCK_N);
    load_tile_packed<BLOCK_N, HEAD_DIM, GROUP>(out.v_t_pairs, v.row(kv_begin), v.row_stride,
                                               rows, c.dims.head_dim_v, lid, BLOCK_N);
  }
}

// One query block of PackedBwd::Rows per work-group of BLOCK_M work-items, over every block of
// the pack, gaps included (zeros).
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, bool REGISTERS, int TILE_M,
          int TILE_K>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void flash_bwd_pack_rows_kernel(BwdParams p) {
  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int lid = static_cast<int>(item.get_local_id(0));
  const PackedBlock coord =
      packed_block<BLOCK_M>(p.row_pack, c.dims.batch, static_cast<int64_t>(item.get_group(0)));
  const SeqInfo seq = seq_info(c, coord.batch);
  const int64_t q_begin = static_cast<int64_t>(coord.block) * BLOCK_M;
  const int rows = static_cast<int>(std::clamp<int64_t>(seq.len_q - q_begin, 0, BLOCK_M));
  const int64_t row0 = seq.q_row0 + q_begin;
  const T* q = static_cast<const T*>(p.q) + coord.batch * p.q_stride.batch +
               coord.head * p.q_stride.head + row0 * p.q_stride.row;
  const T* dout = static_cast<const T*>(p.dout) + coord.batch * p.dout_stride.batch +
                  coord.head * p.dout_stride.head + row0 * p.dout_stride.row;
  using Packed = PackedBwd<T, HEAD_DIM, BLOCK_M, BLOCK_N, REGISTERS, TILE_M, TILE_K>;
  const typename Packed::Rows out = Packed::rows(p, coord.batch, coord.head, coord.block);
  const int d = c.dims.head_dim, d_v = c.dims.head_dim_v;  // Q's, dO's columns
  constexpr int GROUP = Packed::COLUMN_GROUP;
  load_tile_packed<BLOCK_M, HEAD_DIM, GROUP>(out.q_t, q, p.q_stride.row, rows, d, lid, BLOCK_M);
  load_tile_packed<BLOCK_M, HEAD_DIM, GROUP>(out.do_t, dout, p.dout_stride.row, rows, d_v, lid,
                                             BLOCK_M);
  if constexpr (REGISTERS) {
    using Order = typename Packed::Order;
    using RowsTile = T[BLOCK_M][HEAD_DIM];
    using ColumnsTile = T[HEAD_DIM][BLOCK_M];
    const KvRows<T> q_rows{q, p.q_stride.row, nullptr, 0, 0};
    const KvRows<T> do_rows{dout, p.dout_stride.row, nullptr, 0, 0};
    // Tile by tile, Q, dO, Q^T and dO^T go through SLM in row-major order first, as the keys
    // above: two tiles at a time (the rows, then the columns), one barrier each way per pair.
    // All four at once took the whole 64 KiB of the 8-wide engines' SLM at d = 128.
    constexpr int TILE = BLOCK_M * HEAD_DIM;
    constexpr bool TILED = Order::TILED;
    static syclexp::work_group_static<T[TILED ? 2 * TILE : 1]> staged_slm;
    T* const slm = static_cast<T*>(staged_slm);
    const auto write_out = [&](T* first, T* second, int tile_rows, int tile_columns) {
      if constexpr (TILED) {
        sycl::group_barrier(item.get_group());
        Order::copy_from_rows(first, slm, tile_rows, tile_columns, lid, BLOCK_M);
        Order::copy_from_rows(second, slm + TILE, tile_rows, tile_columns, lid, BLOCK_M);
        sycl::group_barrier(item.get_group());  // before the next pair overwrites the SLM
      }
    };
    load_tile<BLOCK_M, HEAD_DIM>(*reinterpret_cast<RowsTile*>(TILED ? slm : out.q), q,
                                 p.q_stride.row, rows, d, lid, BLOCK_M);
    load_tile<BLOCK_M, HEAD_DIM>(*reinterpret_cast<RowsTile*>(TILED ? slm + TILE : out.dout),
                                 dout, p.dout_stride.row, rows, d_v, lid, BLOCK_M);
    write_out(out.q, out.dout, BLOCK_M, HEAD_DIM);
    load_tile_transposed<BLOCK_M, HEAD_DIM>(
        *reinterpret_cast<ColumnsTile*>(TILED ? slm : out.q_cols), q_rows, 0, rows, d, lid,
        BLOCK_M);
    load_tile_transposed<BLOCK_M, HEAD_DIM>(
        *reinterpret_cast<ColumnsTile*>(TILED ? slm + TILE : out.do_cols), do_rows, 0, rows,
        d_v, lid, BLOCK_M);
    write_out(out.q_cols, out.do_cols, HEAD_DIM, BLOCK_M);
  } else {
    constexpr int PAIRS = Packed::PAIR_GROUP;
    load_tile_row_pairs<BLOCK_M, HEAD_DIM, PAIRS>(out.q_pairs, q, p.q_stride.row, rows, d, lid,
                                                  BLOCK_M);
    load_tile_row_pairs<BLOCK_M, HEAD_DIM, PAIRS>(out.do_pairs, dout, p.dout_stride.row, rows,
                                                  d_v, lid, BLOCK_M);
  }
}

}  // namespace ipex_flash
