// The decode kernels' shape limits and parameters.
// Shared verbatim by the host launchers (g++) and the device code (compiled at run time by the
// kernel compiler). Plain C++ only: no SYCL types here.
#pragma once

#include <cstdint>

#include "common/params.hpp"
#include "kvcache/params.hpp"

namespace ipex_flash {

// Work-items of a decode work-group, and so the most query rows (GQA group size x new tokens)
// one decode work-group serves.
constexpr int DECODE_LANES = 16;

// Query rows (over all its K/V heads) a decode work-group of a kernel compiled for head_dim
// keeps Q and O of in local memory. On GPUs one sub-group's worth, DECODE_LANES rows: there a
// work-group gains nothing from serving several K/V heads in turn (their K/V rows are apart),
// and every row costs local memory that keeps other work-groups off the Xe core; with 32-128
// rows the kernels took 33-45 KiB, 1-3 work-groups (one hardware thread each) per core
// (docs/gpus.md, decode against memory bandwidth). On the CPU device, where a work-group
// walking several heads' rows of a key reads one contiguous run (decode/traits.hpp), 2 x 16 KB
// of float32 and at most 128 rows. Past head dim 256 DECODE_LANES rows everywhere (16 of 512
// columns: 2 x 32 KB), which 64 KiB holds up to head dim 480 (the host's decode_fits; beyond,
// the general forward kernel serves those GPUs' decodes).
constexpr int decode_row_capacity(int head_dim, bool cpu_device) {
  if (!cpu_device) return DECODE_LANES;
  return 4096 / head_dim > 128 ? 128 : 4096 / head_dim > DECODE_LANES ? 4096 / head_dim : DECODE_LANES;
}

// Decoding against a KV cache: a few query rows per sequence. One work-group per
// (batch, K/V head, split of the keys) serves every query head of the GQA group, so each K/V
// element is read once for all of them; each split writes a partial output and its LSE, and
// flash_decode_merge_kernel combines the splits.
struct DecodeParams {
  const void* q;             // (B, Hq, Nq, D), input dtype
  const void* k;             // cache (B, Hkv, capacity, D) or pages (P, Hkv, page_size, D)
  const void* v;             // like k
  float* partial_out;        // (B, Hq, Nq, splits, Dv) float32: each split's normalised output
  float* partial_lse;        // (B, Hq, Nq, splits) float32: each split's LSE (-inf: no key)
  void* out;                 // (B, Hq, Nq, Dv), input dtype (merge kernel)
  float* lse;                // see LseStrides (merge kernel)
  BhndStrides q_stride;
  BhndStrides k_stride;      // paged: batch = elements between pages
  BhndStrides v_stride;
  BhndStrides out_stride;
  AttentionCommon common;    // common.num_blocks = splits
  int32_t split_keys;        // keys per split, a multiple of the key block
  int32_t heads_per_group;   // K/V heads per work-group (decode_heads_per_group)
  int32_t row_slices;        // work-groups per K/V head group along its query rows
  // FEATURE_APPEND: common.seq.keys_appended new keys and values (B, Hkv, Nnew, D) views in
  // T, written into the cache (quantised into an FP8 one) before the attention reads them.
  const void* k_new;
  const void* v_new;
  BhndStrides k_new_stride;
  BhndStrides v_new_stride;
  RotaryParams rotary;  // FEATURE_ROTARY: the new keys and the queries rotated first
  CacheBounds bounds;
};

}  // namespace ipex_flash
