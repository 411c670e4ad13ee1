// The check and probe kernels' parameters: the dropout keep-mask and the KV cache check.
// Shared verbatim by the host launchers (g++) and the device code (compiled at run time by the
// kernel compiler). Plain C++ only: no SYCL types here.
#pragma once

#include <cstdint>

#include "common/params.hpp"

namespace ipex_flash {

// The keep mask of a dropout configuration, materialised for tests (small shapes only).
struct DropoutMaskParams {
  uint8_t* keep;         // (B, Hq, Nq, Nk) contiguous: 1 kept, 0 dropped
  AttentionDims dims;
  DropoutParams dropout;
};

// The check of a KV cache's values on the device (probes/cache_check_kernel.hpp).
// Bits of CacheCheckParams::error: which argument held a value out of range.
enum CacheCheckError : uint32_t {
  kSeqlensOutOfRange = 1,   // cache_seqlens < 0, or past the capacity after the append
  kLeftpadOutOfRange = 2,   // cache_leftpad < 0 or past cache_seqlens
  kPageOutOfRange = 4,      // a block_table entry that is not a page of the cache
  kRotaryTooShort = 8,      // rotary tables with fewer rows than the positions read
  // Not errors: values a plan's kernel does not serve (the general path does).
  kFewerKeysThanMin = 16,   // a sequence with fewer keys than PlanLimits::min_keys
  kQueriesNotUniform = 32,  // cu_seqlens_q is not 0, queries, 2 queries, ...
  // Not a value: the bits were found by a serving call (which names its arguments otherwise).
  kFoundByServingCall = 64,
};

// A 4-D view (elements), the output's or the LSE's (its last size 1).
struct FillView {
  void* data;  // null: nothing to fill
  int64_t sizes[4], strides[4];
  int32_t element_bytes;  // 2 or 4
};

// The check's one work-group, and its local memory: a word of each of its sub-groups (the
// smallest sub-groups, the CPU device's, have 4 lanes). A work-group reduction took several
// times as much on the GPUs (gpu-check's record).
constexpr int kCacheCheckGroup = 256;
constexpr int kCacheCheckSubGroups = kCacheCheckGroup / 4;
constexpr int kCacheCheckLocalBytes = kCacheCheckSubGroups * (sizeof(uint32_t) + sizeof(int64_t));

struct CacheCheckParams {
  const int32_t* seqlens;      // (B)
  const int32_t* k_start;      // (B) or null
  const int32_t* block_table;  // (B, table_width) rows table_stride apart, or null
  int64_t table_stride;
  int32_t batch, table_width, pages, capacity, appended;
  int32_t page_size;  // keys per page: sequence b reads its first ceil(keys / page_size) pages
  int32_t rotated, rotary_rows;  // positions from seqlens[b] read in tables of rotary_rows
  int32_t min_keys;             // kFewerKeysThanMin below it
  const int32_t* cu_seqlens_q;  // (B + 1) or null: kQueriesNotUniform unless b * queries
  int32_t queries;
  // Check after the attention: host memory where the bits found among `errors` are or'ed in,
  // with `caller` (kFoundByServingCall or 0); the output and LSE are then set to NaN.
  uint32_t* error;
  uint32_t errors, caller;
  FillView out, lse;
  // Or read before it (error null): host memory that receives the bits and the most keys a
  // sequence attends to, {bits, most}.
  int32_t* report;
};

}  // namespace ipex_flash
