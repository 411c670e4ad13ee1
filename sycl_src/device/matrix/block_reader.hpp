// 2-D block loads through one descriptor (an address payload): the register kernels' A blocks
// (matrix/block_io.hpp). The flat built-ins take the surface (base, extent, pitch) and the
// coordinates with each load, and IGC (ocloc 26.27) builds the descriptor anew for each: three
// to four scalar instructions a load, a tenth of the forward's main loop at d = 128 (BMG). Here
// the descriptor is built once per surface and a load names only its offset from the
// descriptor's coordinates, as immediates, which Xe2's block load encodes (BMG, Lunar Lake:
// `flat[A+(x,y)]`, no instruction; PVC adds them to a copy). The layout probe
// (probes/matrix_layout_probe_kernel.hpp) reads a block at an offset on each device before the
// kernels run. The emulation reads the same elements from memory.
#pragma once

#include <sycl/sycl.hpp>

#include <type_traits>

#if defined(__SYCL_DEVICE_ONLY__) && !defined(IPEX_FLASH_MATRIX_EMULATE)
typedef unsigned short ipex_flash_ushort64 __attribute__((ext_vector_type(64)));
typedef unsigned short ipex_flash_ushort32 __attribute__((ext_vector_type(32)));
// IGC's built-ins (its OpenCL library, IGCBiF_Intrinsics_Lsc.cl): a descriptor for blocks of
// block_width x block_height elements, num_blocks side by side, at (block_x, block_y) of a
// surface `width` bytes wide, `height` rows high, `pitch` bytes from row to row (each minus
// one); and two side-by-side blocks of 32 (16) rows x 16 16-bit elements read through it at
// (block_x + imm_x, block_y + imm_y), imm_x and imm_y constants.
extern "C" SYCL_EXTERNAL int* __builtin_IB_subgroup_createBlock2DAddressPayload(
    long base, int width_minus_one, int height_minus_one, int pitch_minus_one, int block_x,
    int block_y, int block_width, int block_height, int num_blocks);
extern "C" SYCL_EXTERNAL void __builtin_IB_subgroup_setBlock2DAddressPayloadBase(int* payload,
                                                                                long base);
extern "C" SYCL_EXTERNAL ipex_flash_ushort64 __builtin_IB_subgroup_block_read_ap_u16_m32k16v2(
    int* payload, int imm_x, int imm_y, int cache);
extern "C" SYCL_EXTERNAL ipex_flash_ushort32 __builtin_IB_subgroup_block_read_ap_u16_m16k16v2(
    int* payload, int imm_x, int imm_y, int cache);
#define IPEX_FLASH_BLOCK_PAYLOADS 1
#endif

namespace ipex_flash {

// ROWS x 16 V 16-bit elements (V = 2, or 1: a single 16-wide block) of a row-major surface:
// element ROWS * h + i is row i, column 16 h + lane.
template <int ROWS, int V = 2>
struct MatrixBlock {
  unsigned short values[V * ROWS];
};

// Two-wide blocks of ROWS (16 or 32) rows of a row-major 16-bit surface, read from (row0 + DY,
// col0 + DX): the descriptor at (row0, col0), DX and DY compile-time offsets. Elements past
// the surface read 0.
template <int ROWS>
struct MatrixBlockReader {
  static_assert(ROWS == 16 || ROWS == 32, "blocks of 16 or 32 rows");
#if defined(IPEX_FLASH_BLOCK_PAYLOADS)
  int* payload;
#else
  const unsigned short* base;
  int rows, cols, pitch, row0, col0;
#endif

  template <typename T>
  static inline MatrixBlockReader of(const T* base, int rows, int cols, int pitch, int row0,
                                     int col0) {
    static_assert(sizeof(T) == 2, "16-bit elements");
#if defined(IPEX_FLASH_BLOCK_PAYLOADS)
    return {__builtin_IB_subgroup_createBlock2DAddressPayload(
        reinterpret_cast<long>(base), cols * 2 - 1, rows - 1, pitch * 2 - 1, col0, row0, 16,
        ROWS, 2)};
#else
    return {reinterpret_cast<const unsigned short*>(base), rows, cols, pitch, row0, col0};
#endif
  }

  // The same descriptor at another surface of the same shape (one instruction: the register
  // kernels' next K/V block, where building the descriptor anew took seven).
  template <typename T>
  __attribute__((always_inline)) inline void rebase(const T* base_now) {
#if defined(IPEX_FLASH_BLOCK_PAYLOADS)
    __builtin_IB_subgroup_setBlock2DAddressPayloadBase(payload, reinterpret_cast<long>(base_now));
#else
    base = reinterpret_cast<const unsigned short*>(base_now);
#endif
  }

  template <int DX, int DY>
  __attribute__((always_inline)) inline void read(MatrixBlock<ROWS>& block) const {
#if defined(IPEX_FLASH_BLOCK_PAYLOADS)
    if constexpr (ROWS == 32) {
      const ipex_flash_ushort64 v =
          __builtin_IB_subgroup_block_read_ap_u16_m32k16v2(payload, DX, DY, 0);
#pragma unroll
      for (int i = 0; i < 2 * ROWS; ++i) block.values[i] = v[i];
    } else {
      const ipex_flash_ushort32 v =
          __builtin_IB_subgroup_block_read_ap_u16_m16k16v2(payload, DX, DY, 0);
#pragma unroll
      for (int i = 0; i < 2 * ROWS; ++i) block.values[i] = v[i];
    }
#elif defined(__SYCL_DEVICE_ONLY__)  // the emulation, and the 8-wide engines' never-run form
    const auto sg = sycl::ext::oneapi::this_work_item::get_nd_item<1>().get_sub_group();
    const int lane = static_cast<int>(sg.get_local_id()[0]);
    for (int h = 0; h < 2; ++h) {
      const int col = col0 + DX + 16 * h + lane;
      for (int i = 0; i < ROWS; ++i) {
        const int row = row0 + DY + i;
        block.values[h * ROWS + i] =
            row < rows && col < cols ? base[static_cast<int64_t>(row) * pitch + col] : 0;
      }
    }
#else
    for (int i = 0; i < 2 * ROWS; ++i) block.values[i] = 0;  // never run: host pass only
#endif
  }
};

// f(std::integral_constant<int, I>{}) for I = BEGIN, BEGIN + STEP, ... < END: a loop whose
// index is a constant in each turn (MatrixBlockReader's offsets).
template <int BEGIN, int END, int STEP, typename F>
__attribute__((always_inline)) inline void static_for(F&& f) {
  if constexpr (BEGIN < END) {
    f(std::integral_constant<int, BEGIN>{});
    static_for<BEGIN + STEP, END, STEP>(f);
  }
}

}  // namespace ipex_flash
