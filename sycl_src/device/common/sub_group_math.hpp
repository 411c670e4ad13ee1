// Reductions across the lanes of a sub-group, for kernels whose lanes run along the head dim
// (decode): each lane holds a partial sum over its own columns and the lanes must be added up.
//   transpose_sum:  N per-lane partials in, one value per lane out: lane l gets the sum over
//                   all lanes of partial l. A butterfly that halves the number of live values
//                   at every level: N - 1 exchanges for N sums, where N separate reductions
//                   would take N log2(N) exchanges and N broadcasts.
//   lane_group_max / lane_group_sum: the max / sum over aligned groups of WIDTH consecutive
//                   lanes, left in every lane of the group.
#pragma once

#include <sycl/sycl.hpp>

namespace ipex_flash {

template <int N>
constexpr int bit_reverse(int i) {
  int r = 0;
  for (int bit = 1; bit < N; bit <<= 1, i >>= 1) r = (r << 1) | (i & 1);
  return r;
}

namespace detail {

// One butterfly level, 2 * MASK live values: pairs (x, y) = (v[2k], v[2k + 1]) become
//   w[k] = lane & MASK ? y + y[lane ^ MASK] : x + x[lane ^ MASK],
// one exchange per pair. After the levels MASK = N/2, ..., 1, lane l holds the whole sum of
// input bit_reverse(l), so transpose_sum feeds the inputs in bit-reversed order.
template <int MASK, int COUNT>
inline void butterfly_level(sycl::sub_group sg, float (&v)[COUNT], int lane) {
  const bool upper = (lane & MASK) != 0;
#pragma unroll
  for (int k = 0; k < MASK; ++k) {
    const float x = v[2 * k], y = v[2 * k + 1];
    v[k] = (upper ? y : x) + sycl::permute_group_by_xor(sg, upper ? x : y, MASK);
  }
  if constexpr (MASK > 1) butterfly_level<MASK / 2, COUNT>(sg, v, lane);
}

}  // namespace detail

// N == the sub-group size. partials[i] is this lane's share of sum i.
template <int N>
inline float transpose_sum(sycl::sub_group sg, const float (&partials)[N], int lane) {
  float v[N];
#pragma unroll
  for (int p = 0; p < N; ++p) v[p] = partials[bit_reverse<N>(p)];
  detail::butterfly_level<N / 2, N>(sg, v, lane);
  return v[0];
}

template <int WIDTH>
inline float lane_group_max(sycl::sub_group sg, float x) {
#pragma unroll
  for (int mask = 1; mask < WIDTH; mask <<= 1)
    x = sycl::fmax(x, sycl::permute_group_by_xor(sg, x, mask));
  return x;
}

template <int WIDTH>
inline float lane_group_sum(sycl::sub_group sg, float x) {
#pragma unroll
  for (int mask = 1; mask < WIDTH; mask <<= 1) x += sycl::permute_group_by_xor(sg, x, mask);
  return x;
}

}  // namespace ipex_flash
