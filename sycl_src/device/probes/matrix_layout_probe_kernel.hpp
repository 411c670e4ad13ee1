// A check, run once per device and tile shape before the register-resident kernels are used
// (matrix/registers.hpp), that the engine lays tiles out as they assume: an A tile read by its
// coordinates from a surface, B operands built from lane columns, a product, and the
// accumulator's lane columns read, written and scaled, all against plain arithmetic; the A tiles
// are read the ways the kernels read them: tile by tile and in 2-D blocks from a row-major
// surface (N = 16; a block also at an offset through its descriptor, moved to the surface from
// another, matrix/block_reader.hpp), tile by tile from a surface in tile order on the 8-wide
// engines (matrix/surface.hpp). Small integers keep every value exact. One sub-group, which
// writes the surface itself in the order it reads it; verdict[lane] = 1 where its column
// matched.
#pragma once

#include <sycl/sycl.hpp>

#include "matrix/block_io.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

struct LayoutProbeParams {
  void* a;            // room for the surface: (2 M) x (2 K) elements of T, layout_probe_a
  uint32_t* verdict;  // N words
};

// Element (i, j) of the probe's A surface and (k, n) of its B: small integers.
inline float layout_probe_a(int i, int j) { return static_cast<float>((3 * i + j) % 7 - 3); }
inline float layout_probe_b(int k, int n) { return static_cast<float>((k + 2 * n) % 5 - 2); }

template <typename T, int M, int K, int N>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<N>))
void matrix_layout_probe_kernel(LayoutProbeParams p) {
  const auto sg = sycl::ext::oneapi::this_work_item::get_nd_item<1>().get_sub_group();
  const int lane = static_cast<int>(sg.get_local_id()[0]);
  using Surface = PackedSurface<T, M, K, N>;
  const Surface a{static_cast<const T*>(p.a), 2 * M, 2 * K, 2 * K};
  for (int i = lane; i < 4 * M * K; i += N) {
    int row, col;
    Surface::Order::coordinates(i, 2 * K, row, col);
    static_cast<T*>(p.a)[i] = from_float<T>(layout_probe_a(row, col));
  }
  sycl::group_barrier(sg);

  bool match = true;
  // A block read at an offset through its descriptor (matrix/block_reader.hpp), from (M, K):
  // the offsets' units and direction, and the zeros past the surface's edges; the descriptor
  // made for the surface one row on and moved to this one (rebase, as the forward's K and V^T
  // move from block to block).
  if constexpr (!Surface::Order::TILED && 2 * M == 16) {
    MatrixBlock<16> shifted;
    auto reader = MatrixBlockReader<16>::of(a.base + 2 * K, 2 * M, 2 * K, 2 * K, 0, 0);
    reader.rebase(a.base);
    reader.template read<K, M>(shifted);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int row = M + i, col = K + 16 * h + lane;
        const float expected = row < 2 * M && col < 2 * K ? layout_probe_a(row, col) : 0.f;
        match = match && to_float(sycl::bit_cast<T>(shifted.values[h * 16 + i])) == expected;
      }
  }

  // Two of each (matrix_mad_surface's arrays hold at least two tiles on the engine).
  T low[K], high[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    low[k] = from_float<T>(layout_probe_b(k, lane));
    high[k] = from_float<T>(layout_probe_b(K + k, lane));
  }
  MatrixBRegisters<T, K, N> b[2];
  matrix_b_from_column<K>(sg, b[0], low);
  matrix_b_from_column<K>(sg, b[1], high);
  MatrixAcc<M, N> acc[2];
  matrix_fill(sg, acc[0], 0.f);
  matrix_fill(sg, acc[1], 0.f);
  matrix_mad_surface<T, M, K, N, 2 * K, 2>(sg, acc, a, 0, b);  // strip 1: A at (M, 0), (M, K)
  // The same product with the whole surface read as one block (matrix/block_io.hpp), and
  // read as 16-wide blocks at a column, one reduction step each (the dK/dV kernel's form);
  // where there are no 2-D block loads, the product again.
  MatrixAcc<M, N> wide[2], step[2];
  matrix_fill(sg, wide[0], 0.f);
  matrix_fill(sg, wide[1], 0.f);
  matrix_fill(sg, step[0], 0.f);
  matrix_fill(sg, step[1], 0.f);
  if constexpr (Surface::Order::TILED) {
    matrix_mad_surface<T, M, K, N, 2 * K, 2>(sg, wide, a, 0, b);
    matrix_mad_surface_step<T, M, K, N, 2>(sg, step, a, 0, b[0]);
    const Surface right{a.base + a.offset(0, K), 2 * M, 2 * K, 2 * K};  // columns K .. 2K
    matrix_mad_surface_step<T, M, K, N, 2>(sg, step, right, 0, b[1]);
  } else {
    matrix_mad_surface_wide<T, M, K, N, 2 * K, 2, 2 * M>(sg, wide, a, 0, b);
    matrix_mad_surface_step_wide<T, M, K, N, 2>(sg, step, a, 0, 0, b[0]);
    matrix_mad_surface_step_wide<T, M, K, N, 2>(sg, step, a, 0, K, b[1]);
  }
  // Each strip's lane column against plain arithmetic, then written, scaled and read back.
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    float product[M], wide_product[M], step_product[M];
    matrix_acc_column(sg, acc[s], product);
    matrix_acc_column(sg, wide[s], wide_product);
    matrix_acc_column(sg, step[s], step_product);
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float expected = 0.f;
#pragma unroll
      for (int k = 0; k < 2 * K; ++k)
        expected += layout_probe_a(s * M + i, k) * layout_probe_b(k, lane);
#if defined(IPEX_FLASH_TEST_LAYOUT_MISMATCH)  // the test seam: an engine with another layout
      expected += 1.f;
#endif
      match = match && product[i] == expected && wide_product[i] == expected &&
              step_product[i] == expected;
      product[i] = static_cast<float>(i - lane);
    }
    matrix_acc_set_column(sg, acc[s], product);
    matrix_acc_scale_column(sg, acc[s], 2.f);
    matrix_acc_column(sg, acc[s], product);
#pragma unroll
    for (int i = 0; i < M; ++i) match = match && product[i] == 2.f * static_cast<float>(i - lane);
  }
  p.verdict[lane] = match ? 1u : 0u;
}

}  // namespace ipex_flash
