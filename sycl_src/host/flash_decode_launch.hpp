// Host side of the decoding kernels (sycl_src/device/flash_decode.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "host/attention_common.hpp"
#include "host/tensor_view.hpp"
#include "host/variants.hpp"
#include "device/decode/params.hpp"

namespace ipex_flash {

// Query rows one decode work-group serves at most (GQA group size x new tokens). A K/V head
// with more rows (MQA, speculative drafts, short chunks) is served by several work-groups, each
// taking a slice of kMaxDecodeRows rows and reading the keys itself, when there are at most
// max_sliced_decode_tokens(heads_kv) new tokens; otherwise the general forward kernel (which
// also reads paged caches) is used. The general kernel reads the keys once per query head
// whatever its few rows (a Q block of mostly padding), the slices once per slice. On the CPU
// device (B=2, causal, same process) slices won 1.6-7.5x with 8 or 16
// new tokens in all 12 cases (MQA 32/1, 128/1, GQA 32/8, 64/8; fp32 and bf16; 8k keys, and
// 64k once), with 32 won 1.3-2.0x on one or two K/V heads and lost 0.8-0.9x on four or eight,
// and with 64 lost or tied (0.4-1.0x).
constexpr int kMaxDecodeRows = DECODE_LANES;
constexpr int kMaxSlicedDecodeTokens = 16;
constexpr int kMaxSlicedDecodeTokensFewHeads = 32;  // with at most kFewKvHeads K/V heads
constexpr int kFewKvHeads = 2;
inline int max_sliced_decode_tokens(int64_t heads_kv) {
  return heads_kv <= kFewKvHeads ? kMaxSlicedDecodeTokensFewHeads : kMaxSlicedDecodeTokens;
}

// Work-groups along the query rows of one K/V head (slices of kMaxDecodeRows rows).
int decode_row_slices(int rows);

// K/V heads one decode work-group serves: as many as its local memory holds the query rows
// of (rows = GQA group size x new tokens per K/V head), so that it reads each key's heads
// together (contiguous in a (B, N, H, D) cache).
int decode_heads_per_group(int heads_kv, int rows, int head_dim);

// How many splits of the keys to run for this problem, so that batch x head groups x splits
// work-groups fill the device while each split keeps a few key blocks. head_dim: the larger of
// q's and v's.
int decode_num_splits(int batch, int heads_kv, int rows, int head_dim, int max_len_k,
                      std::uintptr_t queue_handle);

// Whether flash_decode serves q (B, Hq, Nq, D) against this cache: the query rows per K/V head
// above and, for 16-bit and FP8 caches, rows starting on 4-byte boundaries and
// head dims (q's and v's) in whole 4-byte words. Other problems go to flash_fwd (which also
// reads caches).
// FP8 caches take the decode kernel only where it has the large register file (or on the CPU
// device): with 128 registers its FP8 conversions spilled on Meteor Lake and, past 8 rows per
// K/V head, on every such GPU (gpu-check); the general kernel serves them there.
bool flash_decode_supported(const TensorView& q, const TensorView& k, const TensorView& v,
                            std::uintptr_t queue_handle);

// out, lse of q (B, Hq, Nq, D) against a cache (options.seqlens_k, maybe block_table).
// partial_out (B, Hq, Nq, splits, Dv: v's head dim) and partial_lse (B, Hq, Nq, splits) are float32 scratch;
// their splits dimension sets the number of splits. With options.k_new, v_new (and maybe the
// rotary tables) the kernel appends them to the cache first (decode_append.hpp): q's dtype,
// at most kMaxDecodeRows query rows per K/V head.
void flash_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, const TensorView& lse, const TensorView& partial_out,
                  const TensorView& partial_lse, const AttentionOptions& options,
                  std::uintptr_t queue_handle);

// The decode variant serving `rows` query rows per K/V head on a device with these limits,
// under IPEX_FLASH_MATRIX mode `mode`, for a cache whose key rows hold the heads side by side
// or not (`heads_interleaved`: (B, N, H, D) and paged caches, not (B, H, N, D)), and the
// program holding its kernels (split, merge). Throws std::runtime_error when the device's
// local memory cannot hold the kernel's.
KernelVariant decode_variant(const std::string& dtype, int head_dim, int rows, int features,
                             bool heads_interleaved, const DeviceLimits& limits,
                             const std::string& mode);
KernelProgram decode_program(const KernelVariant& variant);

// The decode variant flash_decode runs for these tensors (q, k, v as (B, H, N, D) views) and
// options.
KernelVariant flash_decode_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AttentionOptions& options, std::uintptr_t queue_handle);

// Builds the decode kernels serving `rows` query rows per K/V head (GQA group size x new
// tokens, 1..kMaxDecodeRows) without running them (python -m ipex_flash warmup).
KernelVariant warmup_decode(const std::string& dtype, int head_dim, int rows,
                            std::uintptr_t queue_handle);

}  // namespace ipex_flash
