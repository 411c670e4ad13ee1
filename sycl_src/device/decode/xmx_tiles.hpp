// The B tiles of the decode kernel's register form (decode/xmx_kernel.hpp) read lane by lane:
// K^T's (d, keys) with each lane reading its own key's row, V's (keys, dv) with each lane
// reading its own column of each key's row. The kernel reads them so where a tile's rows are
// not evenly spaced or the tile is partial (its general form), and from FP8 caches everywhere:
// Xe's DPAS takes no FP8 operand, so the elements are converted to T in registers on their way
// into the tile (whole 16-bit tiles are read in place: keys_b_load, values_b_load).
//
// An FP8 cache's tiles are half whatever the queries' type (the kernel stages bfloat16 queries'
// rows in half): every e4m3 and e5m2 value is exact in half, so the conversion rounds nothing.
// Four elements of a word are moved by whole-word operations into half bit fields
// (fp8_word_halves, common/dtypes.hpp); e4m3's give its value times 2^-8 (FP8_WORD_UNIT), a unit
// the kernel folds, with k_descale and v_descale, into the scores' scale and the rows' output
// factor. K's rows are read a 32-bit word at a time (rows start on a word: the launcher checks).
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <type_traits>

#include "common/dtypes.hpp"
#include "common/kernel_props.hpp"
#include "matrix/registers.hpp"
#include "matrix/row_tiles.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

// Element u of a word fp8_word_halves split (common/dtypes.hpp), as a half.
__attribute__((always_inline)) inline sycl::half fp8_word_half(uint32_t even, uint32_t odd,
                                                               int u) {
  const uint32_t pair = u % 2 == 0 ? even : odd;
  return sycl::bit_cast<sycl::half>(static_cast<uint16_t>(u < 2 ? pair : pair >> 16));
}

// The FP8 element in the low byte of `byte` (higher bits ignored) as a half, in FP8_WORD_UNIT.
template <typename KV>
__attribute__((always_inline)) inline sycl::half fp8_half(uint32_t byte) {
  uint32_t even, odd;
  fp8_word_halves<KV>(byte, even, odd);
  return fp8_word_half(even, odd, 0);
}

// The K x N tile of K^T whose column `lane` is the K elements from `lane_row` (this lane's key
// row at the reduction step's first column).
template <typename T, int K, typename B, typename KV>
__attribute__((always_inline)) inline void keys_b_from_lane_row(sycl::sub_group sg, B& b,
                                                                const KV* lane_row) {
  if constexpr (sizeof(KV) == 1) {
    static_assert(K % 4 == 0 && std::is_same_v<T, sycl::half>, "whole words, half tiles");
    const uint32_t* words = reinterpret_cast<const uint32_t*>(lane_row);
    sycl::half column[K];
#pragma unroll
    for (int w = 0; w < K / 4; ++w) {
      uint32_t even, odd;
      fp8_word_halves<KV>(words[w], even, odd);
#pragma unroll
      for (int u = 0; u < 4; ++u)  // (Q's columns in this order: staged_column)
        column[4 * w + u] = fp8_word_half(even, odd, u == 1 ? 2 : u == 2 ? 1 : u);
    }
    matrix_b_from_column<K>(sg, b, column);
  } else {
    float column[K];
#pragma unroll
    for (int i = 0; i < K; ++i) column[i] = to_float(lane_row[i]);
    matrix_b_from_floats<K, T>(sg, b, column);
  }
}

// The K x N tile of V whose row i is row_of(i)'s columns col0 .. col0 + N - 1, this lane's
// column `column0` = col0 + lane. An FP8 tile's rows from `rows` on are zero (a partial tile's
// keys past the last, whose probabilities are 0: e5m2's infinity there would make 0 * inf a
// NaN); 16-bit tiles keep the rows read (zeroed, the MLA decode's general form spilled 9 KB on
// BMG).
template <typename T, int K, typename B, typename RowOf>
__attribute__((always_inline)) inline void values_b_from_rows(sycl::sub_group sg, B& b,
                                                              RowOf row_of, int column0,
                                                              int rows) {
  using KV = std::remove_cv_t<std::remove_pointer_t<decltype(row_of(0))>>;
  if constexpr (sizeof(KV) == 1) {
    static_assert(std::is_same_v<T, sycl::half>, "half tiles");
    sycl::half column[K];
#pragma unroll
    for (int i = 0; i < K; ++i) column[i] = fp8_half<KV>(i < rows ? row_of(i)[column0].bits : 0u);
    matrix_b_from_column<K>(sg, b, column);
  } else {
    float column[K];
#pragma unroll
    for (int i = 0; i < K; ++i) column[i] = to_float(row_of(i)[column0]);
    matrix_b_from_floats<K, T>(sg, b, column);
  }
}

// Where lane `lane`'s column of O's (and V's) tile j lies among a sub-group's columns: tile by
// tile (j * N + lane), or with COLUMN_WORDS (FP8 caches, a sub-group's columns a multiple of
// 4N) in groups of four tiles over 4N columns, lane n holding columns 4n .. 4n + 3 of its
// group, one per tile: so that the sub-group reads a V row's 4N bytes as one word per lane
// (load_value_words), each tile of the group taking its byte of the word, where a byte per
// lane and row took a gather, and its address, per element (gpu-check, BMG).
template <bool COLUMN_WORDS, int N>
inline constexpr int value_column(int j, int lane) {
  return COLUMN_WORDS ? j / 4 * 4 * N + 4 * lane + j % 4 : j * N + lane;
}

// Each row_of(i)'s word of this lane at `column` (a group of four tiles' first): the
// sub-group's block load of the row's 4N bytes.
template <int K, typename RowOf>
__attribute__((always_inline)) inline void load_value_words(sycl::sub_group sg, RowOf row_of,
                                                            int column, uint32_t (&words)[K]) {
  using KV = std::remove_cv_t<std::remove_pointer_t<decltype(row_of(0))>>;
  using Rows = RowVectors<KV, 16>;  // (its block-load helpers only: no lane count in them)
#pragma unroll
  for (int i = 0; i < K; ++i)
    sycl::ext::oneapi::experimental::group_load(
        sg, Rows::global_words(reinterpret_cast<const uint32_t*>(row_of(i) + column)), words[i],
        Rows::FULL_GROUP);
}

// The K x N half tile of V whose row i is byte `byte` of words[i] (load_value_words).
template <typename KV, int K, typename B>
__attribute__((always_inline)) inline void values_b_from_words(sycl::sub_group sg, B& b,
                                                               const uint32_t (&words)[K],
                                                               int byte) {
  sycl::half column[K];
#pragma unroll
  for (int i = 0; i < K; ++i) {  // (each word's split shared by its four tiles once inlined)
    uint32_t even, odd;
    fp8_word_halves<KV>(words[i], even, odd);
    column[i] = fp8_word_half(even, odd, byte);
  }
  matrix_b_from_column<K>(sg, b, column);
}

// product(tile) with K^T's tile for one reduction step: read in place from `tile`, the rows of
// its keys `stride` elements apart, or LANE_BY_LANE from `lane_row`, this lane's key's row at
// the step's first column.
template <typename T, int K, int N, bool LANE_BY_LANE, typename KV, typename Product>
__attribute__((always_inline)) inline void keys_tile_product(sycl::sub_group sg, const KV* tile,
                                                             int64_t stride, const KV* lane_row,
                                                             Product product) {
  if constexpr (LANE_BY_LANE) {
    MatrixBRegisters<T, K, N> k_t;
    keys_b_from_lane_row<T, K>(sg, k_t, lane_row);
    product(k_t);
  } else {
    KeysB<T, K, N> k_t;
    keys_b_load(sg, k_t, tile, stride);
    product(k_t);
  }
}

// product(j, tile) for each of a sub-group's O_TILES column tiles j with V's tile j of one key
// tile: in place from `tile` (the sub-group's first column of the key tile's first row, rows
// `stride` apart), or LANE_BY_LANE from row_of(i), the rows from `rows` on zero for FP8; its
// columns from `column0` (the sub-group's first) as value_column places them, with WORD_LOADS
// the sub-group reading a word of each row per group of four tiles.
template <typename T, int K, int N, int O_TILES, bool LANE_BY_LANE, bool COLUMN_WORDS,
          bool WORD_LOADS, typename KV, typename RowOf, typename Product>
__attribute__((always_inline)) inline void for_value_tiles(sycl::sub_group sg, const KV* tile,
                                                           int64_t stride, RowOf row_of,
                                                           int column0, int rows, int lane,
                                                           Product product) {
  uint32_t words[WORD_LOADS ? K : 1];  // a group of four tiles' words
IPEX_FLASH_TILE_LOOP
  for (int j = 0; j < O_TILES; ++j) {
    const auto product_j = [&](auto& v_t) __attribute__((always_inline)) { product(j, v_t); };
    if constexpr (WORD_LOADS) {
      if (j % 4 == 0) load_value_words(sg, row_of, column0 + j * N, words);
      MatrixBRegisters<T, K, N> v_t;
      values_b_from_words<KV>(sg, v_t, words, j % 4);
      product_j(v_t);
    } else if constexpr (LANE_BY_LANE) {
      MatrixBRegisters<T, K, N> v_t;
      const int column = column0 + value_column<COLUMN_WORDS, N>(j, lane);
      values_b_from_rows<T, K>(sg, v_t, row_of, column, rows);
      product_j(v_t);
    } else {  // in place
      ValuesB<T, K, N> v_t;
      values_b_load(sg, v_t, tile + j * N, stride);
      product_j(v_t);
    }
  }
}

}  // namespace ipex_flash
