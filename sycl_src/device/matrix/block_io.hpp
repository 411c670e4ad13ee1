// A tiles read from global memory 32 (or 16) rows by 32 (or 16) columns at a time with the 2-D
// block load of PVC, BMG and Lunar Lake, for the register kernels' products. joint_matrix_load
// reads one 8 x 16 tile per load, and IGC (ocloc 26.27) builds each load's descriptor (base,
// extent, pitch, coordinates, shape: scalar instructions) anew, so a load and its descriptor per
// DPAS were most of the forward's main loop (docs/gpus.md); a block here serves eight (or four)
// DPAS. The block arrives in the A tiles' own layout (lane n holds column n, rows in order), so
// its tiles are handed to joint_matrix element by element, which IGC folds away (no
// instruction: the DPAS read the loaded registers). The layout probe
// (probes/matrix_layout_probe_kernel.hpp) checks this on each device before the kernels run.
#pragma once

#include <sycl/sycl.hpp>

#include "matrix/block_reader.hpp"
#include "matrix/registers.hpp"

#if defined(__SYCL_DEVICE_ONLY__) && !defined(IPEX_FLASH_MATRIX_EMULATE)
typedef unsigned short ipex_flash_ushort16 __attribute__((ext_vector_type(16)));
typedef int ipex_flash_int2 __attribute__((ext_vector_type(2)));
// IGC's built-ins (its OpenCL library; Intel GPUs only, which the SPIR-V names them to): one
// block of 32 (16) rows x 16 16-bit elements at (x, y) = (coord[0], coord[1]) of a surface
// `width` bytes wide, `height` rows high, `pitch` bytes from row to row (each argument minus
// one). The emulation's forms below never call them, and AMX runs no register kernel
// (matrix_tiles_in_registers plans them for 256-register GPUs and the emulation only).
extern "C" SYCL_EXTERNAL ipex_flash_ushort32 __builtin_IB_subgroup_block_read_flat_u16_m32k16v1(
    long base, int width_minus_one, int height_minus_one, int pitch_minus_one,
    ipex_flash_int2 coord);
extern "C" SYCL_EXTERNAL ipex_flash_ushort16 __builtin_IB_subgroup_block_read_flat_u16_m16k16v1(
    long base, int width_minus_one, int height_minus_one, int pitch_minus_one,
    ipex_flash_int2 coord);
#endif

namespace ipex_flash {

// A surface S and, where it is row-major and BLOCKS, the descriptor of its 2-D blocks from row
// 0, built once and moved to the next surface of the same shape by rebase (one instruction):
// the register forward's K and V^T, block after block, whose descriptors built anew for each
// block took seven scalar instructions apiece (PVC, BMG: gpu-check). The emulation reads the
// surface.
template <typename S, int ROWS, bool BLOCKS = !S::Order::TILED>
struct SurfaceBlocks {
  S surface;
  MatrixBlockReader<ROWS> reader;

  static inline SurfaceBlocks of(const S& s) {
    return {s, MatrixBlockReader<ROWS>::of(s.base, s.rows, s.cols, s.pitch, 0, 0)};
  }
  template <typename T>
  __attribute__((always_inline)) inline void rebase(const T* base) {
    surface.base = base;
    reader.rebase(base);
  }
};

// Without blocks (tile by tile, or a kernel's form that reads none): the surface alone.
template <typename S, int ROWS>
struct SurfaceBlocks<S, ROWS, false> {
  S surface;

  static inline SurfaceBlocks of(const S& s) { return {s}; }
  template <typename T>
  __attribute__((always_inline)) inline void rebase(const T* base) {
    surface.base = base;
  }
};

// A 16-wide block of ROWS rows (MatrixBlock<ROWS, 1>, matrix/block_reader.hpp) of a row-major
// surface (base, cols and rows in elements, pitch in elements) from (row, col), a runtime
// column (the dK/dV kernel's slabs).
template <int ROWS, int V = 1, typename T>
__attribute__((always_inline)) inline void matrix_block_load(MatrixBlock<ROWS, V>& block,
                                                             const T* base, int rows, int cols,
                                                             int pitch, int row, int col) {
  static_assert(sizeof(T) == 2 && (ROWS == 16 || ROWS == 32) && V == 1,
                "16-bit blocks of 16 or 32 rows, one wide");
#if defined(__SYCL_DEVICE_ONLY__) && !defined(IPEX_FLASH_MATRIX_EMULATE)
  const long address = reinterpret_cast<long>(base);
  const ipex_flash_int2 at{col, row};
  if constexpr (ROWS == 32) {
    const ipex_flash_ushort32 v = __builtin_IB_subgroup_block_read_flat_u16_m32k16v1(
        address, cols * 2 - 1, rows - 1, pitch * 2 - 1, at);
#pragma unroll
    for (int i = 0; i < ROWS; ++i) block.values[i] = v[i];
  } else {
    const ipex_flash_ushort16 v = __builtin_IB_subgroup_block_read_flat_u16_m16k16v1(
        address, cols * 2 - 1, rows - 1, pitch * 2 - 1, at);
#pragma unroll
    for (int i = 0; i < ROWS; ++i) block.values[i] = v[i];
  }
#else
  (void)base, (void)rows, (void)cols, (void)pitch, (void)row, (void)col;
IPEX_FLASH_TILE_LOOP
  for (int i = 0; i < ROWS; ++i) block.values[i] = 0;  // never run: host pass only
#endif
}

#ifndef IPEX_FLASH_MATRIX_EMULATE

// The A tiles of a block (MatrixBlockReader) times B operands b_lo (its columns 0-15) and
// b_hi (16-31), into the accumulators of its rows, acc[0 .. ROWS / M).
template <typename T, int M, int K, int N, int ROWS, typename B>
__attribute__((always_inline)) inline void matrix_mad_block(sycl::sub_group sg,
                                                            MatrixAcc<M, N>* acc,
                                                            const MatrixBlock<ROWS>& block,
                                                            B& b_lo, B& b_hi) {
  using E = typename MatrixElement<T>::type;
  static_assert(K == 16 && ROWS % M == 0, "blocks of 16-wide steps, whole tiles");
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int t = 0; t < ROWS / M; ++t) {
      MatrixA<T, M, K> a_tile;
      auto data = sycl::ext::oneapi::detail::get_wi_data(sg, a_tile);
#pragma unroll
      for (int i = 0; i < M; ++i)
        data[i] = sycl::bit_cast<E>(block.values[half * ROWS + t * M + i]);
      jm::joint_matrix_mad(sg, acc[t], a_tile, half == 0 ? b_lo : b_hi, acc[t]);
    }
  }
}

// Whether the wide forms read a strip of STRIPS tiles DEPTH deep in whole ROWS x 32 blocks
// (tile by tile otherwise).
template <int M, int K, int DEPTH, int STRIPS, int ROWS>
constexpr bool whole_blocks() {
  return STRIPS * M % ROWS == 0 && DEPTH % (2 * K) == 0;
}

// acc[r / M ..] += the A tiles of `reader`'s blocks (rows 0 .. STRIPS * M, DEPTH columns) . B,
// B held in registers ...
template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int ROWS>
__attribute__((always_inline)) inline void matrix_mad_blocks(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixBlockReader<ROWS>& reader,
    MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  static_for<0, DEPTH, 2 * K>([&](auto k) __attribute__((always_inline)) {
    static_for<0, STRIPS * M, ROWS>([&](auto r) __attribute__((always_inline)) {
      MatrixBlock<ROWS> block;
      reader.template read<decltype(k)::value, decltype(r)::value>(block);
      matrix_mad_block<T, M, K, N, ROWS>(sg, &acc[r / M], block, b[k / K], b[k / K + 1]);
    });
  });
}

// ... or B read two steps at a time in the packed layout (row stride ldb words) from B_SPACE,
// SLM or global memory.
template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int ROWS,
          sycl::access::address_space B_SPACE>
__attribute__((always_inline)) inline void matrix_mad_blocks(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixBlockReader<ROWS>& reader,
    const uint32_t* b, int ldb) {
  static_for<0, DEPTH, 2 * K>([&](auto k) __attribute__((always_inline)) {
    MatrixB<T, K, N> b_lo, b_hi;
    jm::joint_matrix_load(
        sg, b_lo, matrix_ptr<B_SPACE>(reinterpret_cast<const T*>(b + k / 2 * ldb)), 2 * ldb);
    jm::joint_matrix_load(
        sg, b_hi, matrix_ptr<B_SPACE>(reinterpret_cast<const T*>(b + (k + K) / 2 * ldb)),
        2 * ldb);
    static_for<0, STRIPS * M, ROWS>([&](auto r) __attribute__((always_inline)) {
      MatrixBlock<ROWS> block;
      reader.template read<decltype(k)::value, decltype(r)::value>(block);
      matrix_mad_block<T, M, K, N, ROWS>(sg, &acc[r / M], block, b_lo, b_hi);
    });
  });
}

// matrix_mad_surface's forms with A read ROWS x 32 at a time where whole_blocks (tile by tile
// otherwise), through one descriptor (MatrixBlockReader) built here ...
template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int ROWS = 32>
__attribute__((always_inline)) inline void matrix_mad_surface_wide(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixSurface<T>& a, int row0,
    MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  if constexpr (!whole_blocks<M, K, DEPTH, STRIPS, ROWS>())
    matrix_mad_surface<T, M, K, N, DEPTH, STRIPS>(sg, acc, a, row0, b);
  else
    matrix_mad_blocks<T, M, K, N, DEPTH, STRIPS>(
        sg, acc, MatrixBlockReader<ROWS>::of(a.base, a.rows, a.cols, a.pitch, row0, 0), b);
}

template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int ROWS = 32,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space>
__attribute__((always_inline)) inline void matrix_mad_surface_wide(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixSurface<T>& a, int row0,
    const uint32_t* b, int ldb) {
  if constexpr (!whole_blocks<M, K, DEPTH, STRIPS, ROWS>())
    matrix_mad_surface<T, M, K, N, DEPTH, STRIPS, B_SPACE>(sg, acc, a, row0, b, ldb);
  else
    matrix_mad_blocks<T, M, K, N, DEPTH, STRIPS, ROWS, B_SPACE>(
        sg, acc, MatrixBlockReader<ROWS>::of(a.base, a.rows, a.cols, a.pitch, row0, 0), b, ldb);
}

// ... or by the caller, once for a run of surfaces of one shape (SurfaceBlocks with BLOCKS;
// built here without).
template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int ROWS, bool BLOCKS>
__attribute__((always_inline)) inline void matrix_mad_surface_wide(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
    const SurfaceBlocks<MatrixSurface<T>, ROWS, BLOCKS>& a,
    MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  if constexpr (BLOCKS && whole_blocks<M, K, DEPTH, STRIPS, ROWS>())
    matrix_mad_blocks<T, M, K, N, DEPTH, STRIPS>(sg, acc, a.reader, b);
  else
    matrix_mad_surface_wide<T, M, K, N, DEPTH, STRIPS, ROWS>(sg, acc, a.surface, 0, b);
}

template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int ROWS, bool BLOCKS,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space>
__attribute__((always_inline)) inline void matrix_mad_surface_wide(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
    const SurfaceBlocks<MatrixSurface<T>, ROWS, BLOCKS>& a, const uint32_t* b, int ldb) {
  if constexpr (BLOCKS && whole_blocks<M, K, DEPTH, STRIPS, ROWS>())
    matrix_mad_blocks<T, M, K, N, DEPTH, STRIPS, ROWS, B_SPACE>(sg, acc, a.reader, b, ldb);
  else
    matrix_mad_surface_wide<T, M, K, N, DEPTH, STRIPS, ROWS, B_SPACE>(sg, acc, a.surface, 0, b,
                                                                      ldb);
}

// One reduction step, B a single operand in registers (matrix_mad_surface_step), A's K
// columns from col0 read ROWS x 16 at a time: the dK/dV kernel's Q^T and dO^T, a slab's 16
// columns of HEAD_DIM rows, whose tile by tile loads cost a descriptor each. The surface's base
// stays the query block's and only the coordinates move, so IGC keeps the descriptor between
// slabs instead of building it anew from a shifted base.
template <typename T, int M, int K, int N, int STRIPS, int ROWS = STRIPS * M % 32 == 0 ? 32 : 16>
__attribute__((always_inline)) inline void matrix_mad_surface_step_wide(
    sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS], const MatrixSurface<T>& a, int row0,
    int col0, MatrixB<T, K, N>& b) {
  using E = typename MatrixElement<T>::type;
  static_assert(K == 16 && STRIPS * M % ROWS == 0, "whole 16-wide blocks of 16 or 32 rows");
#pragma unroll
  for (int r = 0; r < STRIPS * M; r += ROWS) {
    MatrixBlock<ROWS, 1> block;
    matrix_block_load<ROWS, 1>(block, a.base, a.rows, a.cols, a.pitch, row0 + r, col0);
#pragma unroll
    for (int t = 0; t < ROWS / M; ++t) {
      MatrixA<T, M, K> a_tile;
      auto data = sycl::ext::oneapi::detail::get_wi_data(sg, a_tile);
#pragma unroll
      for (int i = 0; i < M; ++i) data[i] = sycl::bit_cast<E>(block.values[t * M + i]);
      jm::joint_matrix_mad(sg, acc[r / M + t], a_tile, b, acc[r / M + t]);
    }
  }
}

// A B operand read from the packed layout (row stride ldb words) in SLM.
template <typename T, typename B>
__attribute__((always_inline)) inline void matrix_b_load_packed(sycl::sub_group sg, B& b,
                                                                const uint32_t* packed, int ldb) {
  jm::joint_matrix_load(sg, b, matrix_ptr(reinterpret_cast<const T*>(packed)), 2 * ldb);
}

#else  // IPEX_FLASH_MATRIX_EMULATE

// The wide forms read the same tiles: the emulation has no blocks to read.
template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int ROWS = 32>
inline void matrix_mad_surface_wide(sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
                                    const MatrixSurface<T>& a, int row0,
                                    MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  matrix_mad_surface<T, M, K, N, DEPTH, STRIPS>(sg, acc, a, row0, b);
}

template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int ROWS = 32,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space>
inline void matrix_mad_surface_wide(sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
                                    const MatrixSurface<T>& a, int row0, const uint32_t* b,
                                    int ldb) {
  matrix_mad_surface<T, M, K, N, DEPTH, STRIPS, B_SPACE>(sg, acc, a, row0, b, ldb);
}

template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int ROWS, bool BLOCKS>
inline void matrix_mad_surface_wide(sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
                                    const SurfaceBlocks<MatrixSurface<T>, ROWS, BLOCKS>& a,
                                    MatrixBRegisters<T, K, N> (&b)[DEPTH / K]) {
  matrix_mad_surface<T, M, K, N, DEPTH, STRIPS>(sg, acc, a.surface, 0, b);
}

template <typename T, int M, int K, int N, int DEPTH, int STRIPS, int ROWS, bool BLOCKS,
          sycl::access::address_space B_SPACE = sycl::access::address_space::local_space>
inline void matrix_mad_surface_wide(sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
                                    const SurfaceBlocks<MatrixSurface<T>, ROWS, BLOCKS>& a,
                                    const uint32_t* b, int ldb) {
  matrix_mad_surface<T, M, K, N, DEPTH, STRIPS, B_SPACE>(sg, acc, a.surface, 0, b, ldb);
}

// The emulation reads the same columns through the surface shifted to them.
template <typename T, int M, int K, int N, int STRIPS, int ROWS = 32>
inline void matrix_mad_surface_step_wide(sycl::sub_group sg, MatrixAcc<M, N> (&acc)[STRIPS],
                                         const MatrixSurface<T>& a, int row0, int col0,
                                         MatrixBRegisters<T, K, N>& b) {
  const MatrixSurface<T> shifted{a.base + col0, a.rows, a.cols - col0, a.pitch};
  matrix_mad_surface_step<T, M, K, N, STRIPS>(sg, acc, shifted, row0, b);
}

template <typename T, typename B>
inline void matrix_b_load_packed(sycl::sub_group sg, B& b, const uint32_t* packed, int ldb) {
  const int n = static_cast<int>(sg.get_local_id()[0]);
  constexpr int K = sizeof(b.column) / sizeof(b.column[0]);
#pragma nounroll
  for (int i = 0; i < K; ++i) {
    const uint32_t word = packed[i / 2 * ldb + n];
    b.column[i] = from_bits<T>(i % 2 == 0 ? word & 0xffffu : word >> 16);
  }
}

#endif  // IPEX_FLASH_MATRIX_EMULATE

}  // namespace ipex_flash
