// Copies between global memory (any dtype, row stride given, last dim contiguous) and tiles in
// shared local memory (float32, or the input's dtype for the matrix engine). All work-items of
// the group share each copy.
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/dtypes.hpp"
#include "common/kernel_props.hpp"
#include "common/params.hpp"
#include "common/seq_info.hpp"
#include "vector/kv_rows.hpp"

namespace ipex_flash {

// An element as a tile of type Dst holds it: converted to float32 for the vector kernels, or
// copied bit for bit into a tile of the input's own type (the matrix-engine kernels).
template <typename Dst, typename T>
inline Dst tile_element(T x) {
  if constexpr (std::is_same_v<Dst, T>) return x;
  else return from_float<Dst>(to_float(x));
}

template <typename Dst>
inline Dst tile_zero() {
  return from_float<Dst>(0.f);
}

// dst[r][c] = src[r * row_stride + c] for r < rows, c < cols; zero elsewhere, so padded rows
// and head-dim columns contribute nothing to the products that read the tile. Consecutive
// work-items take consecutive columns of a row, so a group of lanes moves one contiguous
// vector (a flat index would make the compiler gather and scatter: r and c would not be
// linear in the lane). A float tile may be scaled on the way: dst = scale * src.
template <int ROWS, int COLS, typename Dst, typename T>
inline void load_tile(Dst (&dst)[ROWS][COLS], const T* src, int64_t row_stride, int rows,
                      int cols, int lid, int group_size, float scale = 1.f) {
  const auto element = [&](int r, int c) {
    if constexpr (std::is_same_v<Dst, float>) return scale * to_float(src[r * row_stride + c]);
    else return tile_element<Dst>(src[r * row_stride + c]);
  };
  if (COLS >= group_size) {
    for (int r = 0; r < ROWS; ++r)
      for (int c = lid; c < COLS; c += group_size)
        dst[r][c] = (r < rows && c < cols) ? element(r, c) : tile_zero<Dst>();
    return;
  }
  for (int i = lid; i < ROWS * COLS; i += group_size) {  // rows shorter than the group
    const int r = i / COLS, c = i % COLS;
    dst[r][c] = (r < rows && c < cols) ? element(r, c) : tile_zero<Dst>();
  }
}

// The same from K/V rows row0 .. row0 + rows (possibly paged).
template <int ROWS, int COLS, typename Dst, typename T>
inline void load_tile(Dst (&dst)[ROWS][COLS], const KvRows<T>& src, int64_t row0, int rows,
                      int cols, int lid, int group_size) {
  if (src.pages == nullptr) {
    load_tile<ROWS, COLS>(dst, src.row(row0), src.row_stride, rows, cols, lid, group_size);
    return;
  }
  for (int r = 0; r < ROWS; ++r) {
    const T* row = r < rows ? src.row(row0 + r) : nullptr;  // one page lookup per row
    for (int c = lid; c < COLS; c += group_size)
      dst[r][c] = (row != nullptr && c < cols) ? tile_element<Dst>(row[c]) : tile_zero<Dst>();
  }
}

// Transposed and scaled: dst[c][r] = scale * src[r * row_stride + c]. Transposed so that
// consecutive work-items (one per row) read consecutive addresses: one vector load.
template <int ROWS, int COLS, typename T>
inline void load_tile_transposed(float (&dst)[COLS][ROWS], const T* src, int64_t row_stride,
                                 int rows, int cols, float scale, int lid, int group_size) {
  for (int i = lid; i < ROWS * COLS; i += group_size) {
    const int r = i / COLS, c = i % COLS;
    dst[c][r] = (r < rows && c < cols) ? scale * to_float(src[r * row_stride + c]) : 0.f;
  }
}

// K or V rows row0 .. row0 + rows transposed into the 16-bit dtype T: dst[c][r] = src row r,
// column c, bit for bit from T, converted (exactly) from an FP8 cache. Consecutive work-items
// take consecutive rows, so the SLM writes are contiguous and the global reads gather; when rows
// are aligned to four elements, a work-item reads four columns per load, which cuts the gathered
// loads by four (they dominate this copy).
template <int ROWS, int COLS, typename T, typename KV>
inline void load_tile_transposed(T (&dst)[COLS][ROWS], const KvRows<KV>& src, int64_t row0,
                                 int rows, int cols, int lid, int group_size) {
  static_assert(sizeof(T) == 2 && sizeof(KV) <= 2 && COLS % 4 == 0,
                "16-bit tiles of 16-bit or 8-bit elements, columns in fours");
  using Element = std::conditional_t<sizeof(KV) == 2, uint16_t, uint8_t>;
  using Four = std::conditional_t<sizeof(KV) == 2, uint64_t, uint32_t>;
  const bool aligned = src.row_stride % 4 == 0 && cols % 4 == 0 &&
                       (src.pages == nullptr || src.page_stride % 4 == 0) &&
                       reinterpret_cast<uintptr_t>(src.base) % sizeof(Four) == 0;
  for (int r = lid; r < ROWS; r += group_size) {
    const KV* row = r < rows ? src.row(row0 + r) : nullptr;
    if (aligned) {
      for (int c = 0; c < COLS; c += 4) {
        const Four four =
            (row != nullptr && c < cols) ? *reinterpret_cast<const Four*>(row + c) : 0;
#pragma unroll
        for (int u = 0; u < 4; ++u)
          dst[c + u][r] = tile_element<T>(
              sycl::bit_cast<KV>(static_cast<Element>(four >> (8 * sizeof(KV) * u))));
      }
    } else {
      for (int c = 0; c < COLS; ++c)
        dst[c][r] = (row != nullptr && c < cols) ? tile_element<T>(row[c]) : tile_zero<T>();
    }
  }
}

// Transposed and packed for the matrix engine's B operand (matrix/slm_tile.hpp): word [c / 2][r]
// holds columns c and c + 1 of row r. With GROUP < ROWS, the rows in groups of GROUP, each
// group's words [c / 2][r % GROUP] contiguous (a sub-group's B operands, one block per tile).
// flip: bits XORed into each word (0x80008000: both 16-bit elements negated, exactly).
template <int ROWS, int COLS, int GROUP = ROWS, typename T>
inline void load_tile_packed(uint32_t* dst, const T* src, int64_t row_stride, int rows, int cols,
                             int lid, int group_size, uint32_t flip = 0) {
  static_assert(ROWS % GROUP == 0, "whole groups of rows");
  for (int i = lid; i < ROWS * COLS / 2; i += group_size) {
    const int r = i % ROWS, c = i / ROWS * 2;
    const T* row = src + r * row_stride;
    const T even = (r < rows && c < cols) ? row[c] : tile_zero<T>();
    const T odd = (r < rows && c + 1 < cols) ? row[c + 1] : tile_zero<T>();
    dst[r / GROUP * (COLS / 2 * GROUP) + c / 2 * GROUP + r % GROUP] = pack_pair(even, odd) ^ flip;
  }
}

template <int ROWS, int COLS, typename T>
inline void load_tile_packed(uint32_t (&dst)[COLS / 2][ROWS], const T* src, int64_t row_stride,
                             int rows, int cols, int lid, int group_size) {
  load_tile_packed<ROWS, COLS>(&dst[0][0], src, row_stride, rows, cols, lid, group_size);
}

// Packed along rows for a B operand whose reduction runs over rows (the backward's Q and dO in
// dK += dS^T.Q, dV += P^T.dO): word [r / 2][c] holds rows r and r + 1 of column c. With
// GROUP < COLS, the columns in groups of GROUP, each group's words [r / 2][c % GROUP]
// contiguous (a sub-group's B operands, one block per tile).
// Consecutive work-items take consecutive columns: both reads and the write are contiguous.
template <int ROWS, int COLS, int GROUP = COLS, typename T>
inline void load_tile_row_pairs(uint32_t* dst, const T* src, int64_t row_stride, int rows,
                                int cols, int lid, int group_size) {
  static_assert(COLS % GROUP == 0, "whole groups of columns");
  for (int r = 0; r < ROWS; r += 2)
    for (int c = lid; c < COLS; c += group_size) {
      const bool inside = c < cols;
      const T even = (inside && r < rows) ? src[r * row_stride + c] : tile_zero<T>();
      const T odd = (inside && r + 1 < rows) ? src[(r + 1) * row_stride + c] : tile_zero<T>();
      dst[c / GROUP * (ROWS / 2 * GROUP) + r / 2 * GROUP + c % GROUP] = pack_pair(even, odd);
    }
}

// One step of streaming K and V through SLM: rows [kv_begin, kv_begin + ROWS) of both, between
// two barriers (no work-item may still be reading the previous block, and all must see the
// new one). Rows past len_k, K's columns past head_dim and V's past head_dim_v are zero.
// V's tile may be narrower than K's (COLS_V: V's compiled head dim).
template <int ROWS, int COLS, int COLS_V, typename Dst, typename T>
inline void load_kv_block(sycl::group<1> group, Dst (&k_tile)[ROWS][COLS],
                          Dst (&v_tile)[ROWS][COLS_V], const KvRows<T>& k, const KvRows<T>& v,
                          int64_t kv_begin, int len_k, int head_dim, int head_dim_v, int lid,
                          int group_size) {
  const int rows = static_cast<int>(std::min<int64_t>(ROWS, len_k - kv_begin));
  sycl::group_barrier(group);
  load_tile<ROWS, COLS>(k_tile, k, kv_begin, rows, head_dim, lid, group_size);
  load_tile<ROWS, COLS_V>(v_tile, v, kv_begin, rows, head_dim_v, lid, group_size);
  sycl::group_barrier(group);
}

// A row of K or V read by a sub-group as float vectors, one element per lane, straight from
// memory with sub-group block loads: they state that the lanes read one contiguous run, where
// lane-indexed loads from a computed row pointer became gathers on the CPU device;
// on GPUs they are the block reads such an access should use. The loads are 32-bit: 16-bit
// block loads were lowered to one insert per element on the CPU device. So for a 16-bit T a
// lane takes two neighbouring columns and one load gives PER_LOAD = 2 vectors (an FP8 T: four) (rows must then
// start on a 4-byte boundary, which the launcher checks): vector vi holds column
// column(vi, lane) in each lane, and whatever meets these vectors (Q, O) is laid out the same.
template <typename T, int LANES>
struct RowVectors {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4, "8-, 16- or 32-bit elements");
  static constexpr int PER_LOAD = 4 / static_cast<int>(sizeof(T));
  // load gives the elements divided by UNIT (FP8_WORD_UNIT; 1 but for e4m3).
  static constexpr float UNIT = FP8_WORD_UNIT<T>;

  static constexpr int column(int vi, int lane) {
    return (vi / PER_LOAD) * (LANES * PER_LOAD) + lane * PER_LOAD + vi % PER_LOAD;
  }

  // group_load's sub-group block read needs both: the whole sub-group loading (full_group;
  // without it group_load reads lane by lane between two barriers) and a global pointer
  // (from a generic one it tests the address space at run time, around the same fallback).
  // Without them the decode loop's every K and V read compiled to a gather of 16 64-bit
  // addresses on every GPU (gpu-check's record). The CPU device keeps the lane-by-lane form,
  // which its compiler makes vector loads: its block reads ran one-row bf16 decode 20 % slower.
#if defined(IPEX_FLASH_CPU_LOOPS)
  static constexpr auto FULL_GROUP = sycl::ext::oneapi::experimental::properties{};
  static inline auto global_words(const uint32_t* words) { return words; }
#else
  static constexpr auto FULL_GROUP =
      sycl::ext::oneapi::experimental::properties{sycl::ext::oneapi::experimental::full_group};
  static inline auto global_words(const uint32_t* words) {
    return sycl::address_space_cast<sycl::access::address_space::global_space,
                                    sycl::access::decorated::no>(words);
  }
#endif

  // Vectors vi0 .. vi0 + PER_LOAD - 1 of `row` (vi0 a multiple of PER_LOAD). With `whole`
  // false (a head dim padded up to the kernel's) masked lane-wise loads, columns at or past
  // `cols` reading 0; `cols` must be a multiple of PER_LOAD (a word is read or not).
  static inline void load(sycl::sub_group sg, const T* row, int vi0, bool whole, int cols,
                          int lane, float (&out)[PER_LOAD]) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(row) + (vi0 / PER_LOAD) * LANES;
    uint32_t word;
    if (whole) {
      sycl::ext::oneapi::experimental::group_load(sg, global_words(words), word, FULL_GROUP);
    } else {
      word = column(vi0, lane) < cols ? words[lane] : 0u;
    }
    if constexpr (PER_LOAD == 1) {
      out[0] = to_float(sycl::bit_cast<T>(word));
    } else if constexpr (PER_LOAD == 2) {
      out[0] = to_float(sycl::bit_cast<T>(static_cast<uint16_t>(word)));
      out[1] = to_float(sycl::bit_cast<T>(static_cast<uint16_t>(word >> 16)));
    } else {  // FP8 (common/kv_quant.hpp), in units of UNIT
      fp8_word_to_float(T{}, word, out);
    }
  }

  // Reads a whole row of COLS columns (whole 32-bit words) and returns its words xor-ed: a
  // load issued early so that a later pass finds the row in cache, where the device's own
  // prefetch compiled to a runtime call per line on the CPU device. The caller must
  // keep the result alive.
  template <int COLS>
  static inline uint32_t touch(sycl::sub_group sg, const T* row) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(row);
    constexpr int WORDS = COLS * static_cast<int>(sizeof(T)) / 4;
    uint32_t all = 0;
#if defined(IPEX_FLASH_CPU_LOOPS)
#pragma unroll
    for (int w = 0; w < WORDS; w += LANES) {
      uint32_t word;
      sycl::ext::oneapi::experimental::group_load(sg, global_words(words + w), word, FULL_GROUP);
      all ^= word;
    }
#else
    // GPUs: one word per 64-byte line is enough to bring the line in; each lane reads a line
    // (the row's last word covers a row that starts mid-line). Reading every word held one
    // register per word until the xor: 16 keys' V rows made the 128-register GPUs spill in the
    // one-row kernels (docs/gpus.md).
    constexpr int LINE_WORDS = 16, LAST_LINE = (WORDS - 1) / LINE_WORDS + 1;
    const int lane = static_cast<int>(sg.get_local_linear_id());
#pragma unroll
    for (int line0 = 0; line0 <= LAST_LINE; line0 += LANES) {
      const int line = line0 + lane;
      if (line <= LAST_LINE) all ^= words[std::min(line * LINE_WORDS, WORDS - 1)];
    }
#endif
    return all;
  }
};

}  // namespace ipex_flash
