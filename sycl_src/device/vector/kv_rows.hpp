// Rows of a K/V cache, contiguous or paged (KvRows), and whether a sequence's pages are all
// pages of the pool: what every kernel reading K or V rows by key goes through.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "common/kernel_props.hpp"
#include "common/params.hpp"
#include "common/seq_info.hpp"

namespace ipex_flash {

// Rows of K or V: contiguous with a row stride, or spread over the pages of a paged KV cache
// (page p of the sequence is pages[p]; a page holds page_size rows). A paged sequence's keys
// are int32 (seqlens_k), so its page and the row within it are found in 32 bits: Intel GPUs
// emulate a 64-bit division with some 60 instructions, which the decode kernel paid per key
// read (gpu-check's record). On GPUs a page of a power of two rows (vLLM's 16-64, flash-attn's
// 256) takes a shift instead of the division: with the division the one-row decode kernel
// spilled on DG2 (2.7 KB). The OpenCL CPU compiler divides: with the shift chosen at run time
// it made the decode kernel's loads gathers, 2-3x slower, contiguous caches too.
template <typename T>
struct KvRows {
  const T* base;          // row 0, or page 0 of the pool when paged
  int64_t row_stride;
  const int32_t* pages;   // null: contiguous
  int64_t page_stride;
  int32_t page_size;
  int32_t page_shift;     // log2(page_size), or -1: not a power of two

  IPEX_FLASH_INLINE inline const T* row(int64_t r) const {
    if (pages == nullptr) return base + r * row_stride;
    const int32_t key = static_cast<int32_t>(r);
#if defined(IPEX_FLASH_CPU_LOOPS)
    const int32_t page = key / page_size;
#else
    const int32_t page = page_shift >= 0 ? key >> page_shift : key / page_size;
#endif
    return base + static_cast<int64_t>(pages[page]) * page_stride +
           static_cast<int64_t>(key - page * page_size) * row_stride;
  }
};

// KvRows::page_shift of a page size.
inline int32_t page_shift_of(int32_t page_size) {
  return page_size > 0 && (page_size & (page_size - 1)) == 0
             ? static_cast<int32_t>(sycl::ctz(static_cast<uint32_t>(page_size)))
             : -1;
}

// The K (or V) rows of sequence b and K/V head h_kv: from the sequence's first packed row, or
// through its pages (then stride.batch is the stride between pages and there is no batch
// offset).
template <typename T>
inline KvRows<T> kv_rows(const void* base, const BhndStrides& stride, const AttentionCommon& c,
                         const SeqInfo& seq, int b, int h_kv) {
  const int32_t* pages =
      c.seq.block_table != nullptr ? c.seq.block_table + b * c.seq.block_table_stride : nullptr;
  const int64_t offset = (pages != nullptr ? 0 : b * stride.batch) + h_kv * stride.head +
                         seq.k_row0 * stride.row;
  return KvRows<T>{static_cast<const T*>(base) + offset, stride.row, pages, stride.batch,
                   c.seq.page_size, page_shift_of(c.seq.page_size)};
}

// Whether the block_table entries that keys [begin, end) of sequence b read are all pages of
// the pool (CacheBounds::pages), the group's lanes sharing the entries; true unpaged.
template <typename Group>
inline bool split_pages_in_pool(Group group, const AttentionCommon& c, const CacheBounds& bounds,
                                int b, int64_t begin, int64_t end) {
  if (c.seq.block_table == nullptr || end <= begin) return true;
  const int32_t* pages = c.seq.block_table + b * c.seq.block_table_stride;
  bool in_pool = true;
  for (int64_t i = begin / c.seq.page_size + group.get_local_linear_id();
       i <= (end - 1) / c.seq.page_size; i += group.get_local_linear_range())
    in_pool = in_pool && page_in_pool(pages[i], bounds.pages);
  return sycl::all_of_group(group, in_pool);
}

// Whether the block_table entry that key `key` of sequence b reads is a page of the pool; true
// unpaged.
inline bool key_page_in_pool(const AttentionCommon& c, const CacheBounds& bounds, int b,
                             int64_t key) {
  if (c.seq.block_table == nullptr) return true;
  return page_in_pool(c.seq.block_table[b * c.seq.block_table_stride + key / c.seq.page_size],
                      bounds.pages);
}

}  // namespace ipex_flash
