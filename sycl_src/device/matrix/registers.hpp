// Matrix tiles kept in registers between products, read and written by lane columns: the
// kernels of forward/registers_kernel.hpp and backward/dq_registers_kernel.hpp hold their
// accumulators and their P or dS operands here instead of in SLM.
//
// Lane columns: lane n of the sub-group holds column n of an accumulator (M x N), its element i
// being row i, and column n of a B operand (K x N), its element i being row k = i. That is how the
// XMX engines lay out DPAS operands on every Intel GPU with them (row m of an accumulator is one
// register, one lane per column; a packed B register holds rows 2w and 2w+1 of each lane's column),
// and how the emulation (matrix/slm_tile.hpp, matrix/registers_emulated.hpp) lays them out by
// construction. The host plans these kernels only where the layout holds
// (DeviceLimits::matrix_lane_columns, matrix_tiles_in_registers), and runs
// probes/matrix_layout_probe_kernel.hpp first to check it: not on the CPU device's AMX, whose tiles
// are a different register file altogether (the SLM-staged kernels serve it).
//
// The attention kernels own one query row per lane, computed transposed (the query is the
// accumulators' column), so a lane's column of S^T is its row's scores, and a row's softmax
// needs no exchange between lanes.
#pragma once

#include <sycl/sycl.hpp>

#include "common/dtypes.hpp"
#include "matrix/surface.hpp"
#include "matrix/slm_tile.hpp"

// The loops over a kernel's register tiles are unrolled on the engines: a tile is registers,
// and an array of them indexed at run time would live in scratch memory. Emulated (the CPU
// device, in tests), a tile is M floats per lane, and the CPU compiler took much longer to
// build a d = 128 forward and backward unrolled than rolled. Code for one of the two says which
// (#pragma unroll or nounroll); code for both (the register kernels, the helpers below the
// emulation) says IPEX_FLASH_TILE_LOOP.
// IPEX_FLASH_STEP_LOOP(n): a loop whose iterations index no register array, unrolled n times
// on the engines (a long reduction whose every load IGC would otherwise issue at once).
#if defined(IPEX_FLASH_MATRIX_EMULATE)
#define IPEX_FLASH_TILE_LOOP _Pragma("nounroll")
#define IPEX_FLASH_STEP_LOOP(n) _Pragma("nounroll")
#else
#define IPEX_FLASH_TILE_LOOP _Pragma("unroll")
#define IPEX_FLASH_STEP_PRAGMA(x) _Pragma(#x)
#define IPEX_FLASH_STEP_LOOP(n) IPEX_FLASH_STEP_PRAGMA(unroll n)
#endif

// One of two implementations of the same functions: on the matrix engines, or emulated.
#if defined(IPEX_FLASH_MATRIX_EMULATE)
#include "matrix/registers_emulated.hpp"
#else
#include "matrix/registers_xmx.hpp"
#endif

namespace ipex_flash {

// Keys c0 .. c0 + CHUNK - 1 of the lane's row (CHUNK: MATRIX_KEY_CHUNK, or fewer whole tiles):
// its columns of the score tiles (S^T, dP^T: M keys each) that hold them, read and written back.
template <int M, typename Acc, int TILES, int CHUNK>
__attribute__((always_inline)) inline void chunk_of_columns(sycl::sub_group sg, Acc (&s)[TILES],
                                                            int c0, float (&chunk)[CHUNK]) {
  static_assert(CHUNK % M == 0, "whole tiles per chunk");
IPEX_FLASH_TILE_LOOP
  for (int t = 0; t < CHUNK / M; ++t) {
    float column[M];
    matrix_acc_column(sg, s[c0 / M + t], column);
IPEX_FLASH_TILE_LOOP
    for (int m = 0; m < M; ++m) chunk[t * M + m] = column[m];
  }
}

template <int M, typename Acc, int TILES>
__attribute__((always_inline)) inline void set_chunk_of_columns(
    sycl::sub_group sg, Acc (&s)[TILES], int c0, const float (&chunk)[MATRIX_KEY_CHUNK]) {
IPEX_FLASH_TILE_LOOP
  for (int t = 0; t < MATRIX_KEY_CHUNK / M; ++t) {
    float column[M];
IPEX_FLASH_TILE_LOOP
    for (int m = 0; m < M; ++m) column[m] = chunk[t * M + m];
    matrix_acc_set_column(sg, s[c0 / M + t], column);
  }
}

// The lane's column of every tile, in order: a query row's values along the tiles' rows
// (the output or dQ row from its O^T or dQ^T tiles).
template <int M, typename Acc, int TILES>
__attribute__((always_inline)) inline void lane_row_of_tiles(sycl::sub_group sg,
                                                             Acc (&tiles)[TILES],
                                                             float (&row)[TILES * M]) {
IPEX_FLASH_TILE_LOOP
  for (int t = 0; t < TILES; ++t) {
    float column[M];
    matrix_acc_column(sg, tiles[t], column);
IPEX_FLASH_TILE_LOOP
    for (int m = 0; m < M; ++m) row[t * M + m] = column[m];
  }
}

}  // namespace ipex_flash
