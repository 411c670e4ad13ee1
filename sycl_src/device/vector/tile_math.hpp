// The two inner loops every attention kernel is made of, for the "one work-item per row"
// layout: the work-item's own vector lives in a transposed SLM tile (d, lane) so that lanes
// read consecutive addresses, and the other operand's rows are broadcast to all lanes.
//   dot_rows:       out[j] = sum_d own_t[d][lane] * rows[row0 + j][d]        (Q.K^T, dO.V^T)
//   accumulate_rows: acc_t[d][lane] = acc_t[d][lane] * rescale
//                                     + sum_j weight[j] * rows[row0 + j][d]  (P.V, dS.K)
#pragma once

namespace ipex_flash {

constexpr int D_UNROLL = 8;  // independent accumulators per lane: hides FMA latency

// The key loop of accumulate_rows indexes the work-item's weights. On GPUs it is unrolled: a
// private array indexed at run time lives in scratch memory there (IGC's private_size), and
// unrolled it stays in registers. On the SYCL CPU device it is kept rolled: unrolled, that
// device's compiler packs it into gathers in the backward kernels (seen in their assembly), and
// they ran 3x slower. The host defines IPEX_FLASH_CPU_LOOPS when it compiles for the CPU device
// (KernelProgram::options).
#if defined(IPEX_FLASH_CPU_LOOPS)
#define IPEX_FLASH_KEY_LOOP _Pragma("nounroll")
#else
#define IPEX_FLASH_KEY_LOOP _Pragma("unroll")
#endif

// Both over one slab of the head dim, columns col0 .. col0 + COLS of the work-item's vector
// against a tile of those columns alone (the forward's K/V slabs, forward/vector_kernel.hpp);
// dot_rows and accumulate_rows below are the one slab of every column:
//   dot_rows_slab:        out[j] += sum_{d < COLS} own_t[col0 + d][lane] * rows[row0 + j][d]
//   accumulate_rows_slab: acc_t[col0 + d][lane] = acc_t[col0 + d][lane] * rescale
//                                                 + sum_j weight[j] * rows[row0 + j][d]
// Called slab by slab in ascending col0, dot_rows_slab sums in dot_rows's order.
template <int CHUNK, int HEAD_DIM, int LANES, int ROWS, int COLS>
inline void dot_rows_slab(float (&out)[CHUNK], const float (&own_t)[HEAD_DIM][LANES], int lane,
                          const float (&rows)[ROWS][COLS], int row0, int col0) {
  for (int d = 0; d < COLS; ++d) {
    const float own_d = own_t[col0 + d][lane];
#pragma unroll
    for (int j = 0; j < CHUNK; ++j) out[j] += own_d * rows[row0 + j][d];
  }
}

template <int CHUNK, int HEAD_DIM, int LANES, int ROWS, int COLS>
inline void accumulate_rows_slab(float (&acc_t)[HEAD_DIM][LANES], int lane,
                                 const float (&weight)[CHUNK], const float (&rows)[ROWS][COLS],
                                 int row0, int col0, float rescale) {
  static_assert(COLS % D_UNROLL == 0, "tile shape: slabs of whole multiples of 8 columns");
  for (int d0 = 0; d0 < COLS; d0 += D_UNROLL) {
    float acc[D_UNROLL];  // (d)
#pragma unroll
    for (int u = 0; u < D_UNROLL; ++u) acc[u] = acc_t[col0 + d0 + u][lane] * rescale;
    IPEX_FLASH_KEY_LOOP
    for (int j = 0; j < CHUNK; ++j)
#pragma unroll
      for (int u = 0; u < D_UNROLL; ++u) acc[u] += weight[j] * rows[row0 + j][d0 + u];
#pragma unroll
    for (int u = 0; u < D_UNROLL; ++u) acc_t[col0 + d0 + u][lane] = acc[u];
  }
}

template <int CHUNK, int HEAD_DIM, int LANES, int ROWS>
inline void dot_rows(float (&out)[CHUNK], const float (&own_t)[HEAD_DIM][LANES], int lane,
                     const float (&rows)[ROWS][HEAD_DIM], int row0) {
#pragma unroll
  for (int j = 0; j < CHUNK; ++j) out[j] = 0.f;
  dot_rows_slab(out, own_t, lane, rows, row0, 0);
}

template <int CHUNK, int HEAD_DIM, int LANES, int ROWS>
inline void accumulate_rows(float (&acc_t)[HEAD_DIM][LANES], int lane,
                            const float (&weight)[CHUNK], const float (&rows)[ROWS][HEAD_DIM],
                            int row0, float rescale) {
  accumulate_rows_slab(acc_t, lane, weight, rows, row0, 0, rescale);
}

}  // namespace ipex_flash
