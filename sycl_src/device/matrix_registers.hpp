// Matrix tiles kept in registers between products, read and written by lane columns: the
// kernels of flash_fwd_matrix_registers.hpp and flash_bwd_dq_registers.hpp hold their
// accumulators and their P or dS operands here instead of in SLM.
//
// Lane columns: lane n of the sub-group holds column n of an accumulator (M x N), its element
// i being row i, and column n of a B operand (K x N), its element i being row k = i. That is
// how the XMX engines lay out DPAS operands on every Intel GPU with them (row m of an
// accumulator is one register, one lane per column; a packed B register holds rows 2w and 2w+1
// of each lane's column), and how the emulation (matrix_tile.hpp) lays them out by
// construction. The host plans these kernels only where the layout holds
// (DeviceLimits::matrix_lane_columns, matrix_tiles_in_registers), and runs
// matrix_layout_probe.hpp first to check it: not on the CPU device's AMX, whose tiles are a
// different register file altogether (the SLM-staged kernels serve it).
//
// The attention kernels own one query row per lane, computed transposed (the query is the
// accumulators' column), so a lane's column of S^T is its row's scores, and a row's softmax
// needs no exchange between lanes.
#pragma once

#include <sycl/sycl.hpp>

#include "dtypes.hpp"
#include "matrix_surface.hpp"
#include "matrix_tile.hpp"

// The loops over a kernel's register tiles are unrolled on the engines: a tile is registers,
// and an array of them indexed at run time would live in scratch memory. Emulated (the CPU
// device, in tests), a tile is M floats per lane, and the CPU compiler took 204 s to build a
// d = 128 forward and backward unrolled, 132 s rolled. Code for one of the two says which
// (#pragma unroll or nounroll); code for both (the register kernels, the helpers below the
// emulation) says IPEX_FLASH_TILE_LOOP.
#if defined(IPEX_FLASH_MATRIX_EMULATE)
#define IPEX_FLASH_TILE_LOOP _Pragma("nounroll")
#else
#define IPEX_FLASH_TILE_LOOP _Pragma("unroll")
#endif

namespace ipex_flash {

#ifndef IPEX_FLASH_MATRIX_EMULATE

template <typename T, int K, int N>
using MatrixBRegisters = MatrixB<T, K, N>;

// Templated on the tile types: joint_matrix's sizes are size_t, which MatrixAcc<int M, int N>
// cannot deduce. Elements are reached through get_wi_data with constant indices:
// joint_matrix_apply runs to a length only the GPU compiler knows, and filling a B operand
// through it, element by element with a counter, made IGC (ocloc 26.27) drop the kernel's
// products altogether.
// The lane's column of accumulator `acc` (M rows): column[i] = acc (i, lane).
template <typename Acc, int M>
__attribute__((always_inline)) inline void matrix_acc_column(sycl::sub_group sg, Acc& acc,
                                                             float (&column)[M]) {
  auto data = sycl::ext::oneapi::detail::get_wi_data(sg, acc);
#pragma unroll
  for (int i = 0; i < M; ++i) column[i] = data[i];
}

// Sets the lane's column of `acc`: acc (i, lane) = column[i].
template <typename Acc, int M>
__attribute__((always_inline)) inline void matrix_acc_set_column(sycl::sub_group sg, Acc& acc,
                                                                 const float (&column)[M]) {
  auto data = sycl::ext::oneapi::detail::get_wi_data(sg, acc);
#pragma unroll
  for (int i = 0; i < M; ++i) data[i] = column[i];
}

// Multiplies the lane's column of `acc` by `factor` (one factor per query row).
template <typename Acc>
__attribute__((always_inline)) inline void matrix_acc_scale_column(sycl::sub_group sg, Acc& acc,
                                                                   float factor) {
  jm::joint_matrix_apply(sg, acc, [=](float& x) { x *= factor; });
}

// The lane's column of a B operand from K values in T (column[i] = B (i, lane)).
template <int K, typename B, typename T>
__attribute__((always_inline)) inline void matrix_b_from_column(sycl::sub_group sg, B& b,
                                                                const T* column) {
  using E = typename MatrixElement<T>::type;
  auto data = sycl::ext::oneapi::detail::get_wi_data(sg, b);
#pragma unroll
  for (int i = 0; i < K; ++i) data[i] = sycl::bit_cast<E>(column[i]);
}

// The same from K float values, each rounded once to the operand's type.
template <int K, typename T, typename B>
__attribute__((always_inline)) inline void matrix_b_from_floats(sycl::sub_group sg, B& b,
                                                                const float (&column)[K]) {
  using E = typename MatrixElement<T>::type;
  auto data = sycl::ext::oneapi::detail::get_wi_data(sg, b);
#pragma unroll
  for (int i = 0; i < K; ++i) data[i] = sycl::bit_cast<E>(from_float<T>(column[i]));
}

// The A tile at (row, col) of `surface`: by its coordinates where the surface is row-major
// (2-D block loads); from its address where it is tile by tile (the 8-wide engines, which have
// neither 2-D block loads nor joint_matrix_load_checked: IGC refuses it for them).
template <typename A, typename T, int TM, int TK>
__attribute__((always_inline)) inline void matrix_load_a(sycl::sub_group sg, A& a,
                                                         const MatrixSurface<T, TM, TK>& surface,
                                                         int row, int col) {
  if constexpr (SurfaceOrder<TM, TK>::TILED)
    jm::joint_matrix_load(
        sg, a, matrix_ptr<sycl::access::address_space::global_space>(
                   surface.base + surface.offset(row, col)),
        TK);
  else
    sycl::ext::intel::experimental::matrix::joint_matrix_load_checked(
        sg, a, matrix_ptr<sycl::access::address_space::global_space>(surface.base),
        surface.pitch, surface.rows, surface.cols, row, col);
}

// Asks for a contiguous run of ELEMENTS to be brought into the cache ahead of its loads, share
// `part` of PARTS (a sub-group's), as 2-D block prefetches: 32 rows of 64 bytes each, the
// widest a prefetch takes. Chunk c goes to part c % PARTS; where the chunks do not split evenly
// (head dims 16 and 48: 2 and 6 chunks for 4 parts) the last round skips the parts past them.
template <int ELEMENTS, int PARTS, typename T>
__attribute__((always_inline)) inline void matrix_prefetch_run(sycl::sub_group sg, const T* base,
                                                               int part) {
  namespace syclex = sycl::ext::oneapi::experimental;
  using E = typename MatrixElement<T>::type;
  constexpr int WIDTH = 64 / sizeof(T), ROWS = 32, CHUNK = WIDTH * ROWS;
  constexpr int CHUNKS = ELEMENTS / CHUNK;
  static_assert(ELEMENTS % CHUNK == 0, "whole chunks");
#pragma unroll
  for (int i = 0; i < (CHUNKS + PARTS - 1) / PARTS; ++i) {
    const int chunk = part + i * PARTS;
    if (CHUNKS % PARTS == 0 || chunk < CHUNKS)
      jm::joint_matrix_prefetch<ROWS, WIDTH>(
          sg, reinterpret_cast<const E*>(base + chunk * CHUNK), WIDTH, jm::layout::row_major,
          syclex::properties{syclex::prefetch_hint_L1});
  }
}

// acc[s] (M x N) += A_s (M x DEPTH) . B for A_s the s-th M-row strip of `a` from row `row0`:
// B read in the packed layout (row stride ldb words) from B_SPACE, SLM or global memory, one B
// tile per reduction step for all strips (matrix_mad_strips' form) ...
template <typename T, int M, int K, int N, int DEPTH, int STRIPS,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space, int TM,
          int TK>
__attribute__((always_inline)) inline void matrix_mad_surface(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixSurface<T, TM, TK>& a,
    int row0, const uint32_t* b, int ldb) {
  static_assert(STRIPS >= 2, "at least two tiles per array (see the overload below)");
  MatrixA<T, M, K> a_tile;
  MatrixB<T, K, N> b_tile;
#pragma unroll
  for (int k = 0; k < DEPTH; k += K) {
    jm::joint_matrix_load(
        sg, b_tile, matrix_ptr<B_SPACE>(reinterpret_cast<const T*>(b + k / 2 * ldb)), 2 * ldb);
#pragma unroll
    for (int s = 0; s < STRIPS; ++s) {
      matrix_load_a(sg, a_tile, a, row0 + s * M, k);
      jm::joint_matrix_mad(sg, acc[s], a_tile, b_tile, acc[s]);
    }
  }
}

// ... or B held in registers, the DEPTH / K operands b[].
template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int TM, int TK>
__attribute__((always_inline)) inline void matrix_mad_surface(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixSurface<T, TM, TK>& a,
    int row0, MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  // IGC (ocloc 26.27) drops a kernel whose elements it reaches in an array of one joint_matrix
  // (every store after it vanished); two or more are kept.
  static_assert(STRIPS >= 2 && DEPTH / K >= 2, "at least two tiles per array");
  MatrixA<T, M, K> a_tile;
#pragma unroll
  for (int k = 0; k < DEPTH; k += K) {
#pragma unroll
    for (int s = 0; s < STRIPS; ++s) {
      matrix_load_a(sg, a_tile, a, row0 + s * M, k);
      jm::joint_matrix_mad(sg, acc[s], a_tile, b[k / K], acc[s]);
    }
  }
}

// ... or one reduction step, B a single operand in registers: a lone joint_matrix, not an
// array of one.
template <typename T, int M, int K, int N, int STRIPS, int TM, int TK>
__attribute__((always_inline)) inline void matrix_mad_surface_step(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixSurface<T, TM, TK>& a,
    int row0, MatrixBRegisters<T, K, N>& b) {
  static_assert(STRIPS >= 2, "at least two tiles per array");
  MatrixA<T, M, K> a_tile;
#pragma unroll
  for (int s = 0; s < STRIPS; ++s) {
    matrix_load_a(sg, a_tile, a, row0 + s * M, 0);
    jm::joint_matrix_mad(sg, acc[s], a_tile, b, acc[s]);
  }
}

#else  // IPEX_FLASH_MATRIX_EMULATE

template <typename T, int K, int N>
struct MatrixBRegisters {
  T column[K];  // lane n's column of B
};

template <int M, int N>
inline void matrix_acc_column(sycl::sub_group, MatrixAcc<M, N>& acc, float (&column)[M]) {
#pragma nounroll
  for (int m = 0; m < M; ++m) column[m] = acc.column[m];
}

template <int M, int N>
inline void matrix_acc_set_column(sycl::sub_group, MatrixAcc<M, N>& acc,
                                  const float (&column)[M]) {
#pragma nounroll
  for (int m = 0; m < M; ++m) acc.column[m] = column[m];
}

template <int M, int N>
inline void matrix_acc_scale_column(sycl::sub_group, MatrixAcc<M, N>& acc, float factor) {
#pragma nounroll
  for (int m = 0; m < M; ++m) acc.column[m] *= factor;
}

template <int K, typename T, int N>
inline void matrix_b_from_column(sycl::sub_group, MatrixBRegisters<T, K, N>& b, const T* column) {
#pragma nounroll
  for (int i = 0; i < K; ++i) b.column[i] = column[i];
}

template <int K, typename T, typename B>
inline void matrix_b_from_floats(sycl::sub_group, B& b, const float (&column)[K]) {
#pragma nounroll
  for (int i = 0; i < K; ++i) b.column[i] = from_float<T>(column[i]);
}

template <int ELEMENTS, int PARTS, typename T>
inline void matrix_prefetch_run(sycl::sub_group, const T*, int) {}  // nothing to hide here

// The emulation reads A element by element in the surface's order; the kernels' surfaces are
// whole padded blocks.
template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int TM, int TK>
inline void matrix_mad_surface(sycl::sub_group, MatrixAcc<M, N> (&acc)[STRIPS],
                               const MatrixSurface<T, TM, TK>& a, int row0,
                               MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  // As matrix_mad_strips' emulation: strip by strip, the column in registers.
#pragma unroll 1
  for (int s = 0; s < STRIPS; ++s) {
    float column[M];
#pragma nounroll
    for (int m = 0; m < M; ++m) column[m] = acc[s].column[m];
    for (int k = 0; k < DEPTH; ++k) {
      const float b_k = to_float(b[k / K].column[k % K]);
#pragma nounroll
      for (int m = 0; m < M; ++m)
        column[m] += to_float(a.base[a.offset(row0 + s * M + m, k)]) * b_k;
    }
#pragma nounroll
    for (int m = 0; m < M; ++m) acc[s].column[m] = column[m];
  }
}

template <typename T, int M, int K, int N, int DEPTH, int STRIPS,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space, int TM,
          int TK>
inline void matrix_mad_surface(sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
                               const MatrixSurface<T, TM, TK>& a, int row0, const uint32_t* b,
                               int ldb) {
  if constexpr (!SurfaceOrder<TM, TK>::TILED) {
    matrix_mad_strips<T, M, K, N, DEPTH, STRIPS>(
        sg, acc, a.base + static_cast<int64_t>(row0) * a.pitch, a.pitch, b, ldb);
  } else {  // B's columns from its packed words (element (k, n): half k % 2 of word [k / 2][n])
    const int n = static_cast<int>(sg.get_local_id()[0]);
    MatrixBRegisters<T, K, N> columns[DEPTH / K];
    for (int k = 0; k < DEPTH; ++k) {
      const uint32_t word = b[k / 2 * ldb + n];
      columns[k / K].column[k % K] = from_bits<T>(k % 2 == 0 ? word & 0xffffu : word >> 16);
    }
    matrix_mad_surface<T, M, K, N, DEPTH, STRIPS>(sg, acc, a, row0, columns);
  }
}

template <typename T, int M, int K, int N, int STRIPS, int TM, int TK>
inline void matrix_mad_surface_step(sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
                                    const MatrixSurface<T, TM, TK>& a, int row0,
                                    MatrixBRegisters<T, K, N>& b) {
  MatrixBRegisters<T, K, N> one[1] = {b};
  matrix_mad_surface<T, M, K, N, K, STRIPS>(sg, acc, a, row0, one);
}

#endif  // IPEX_FLASH_MATRIX_EMULATE

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
