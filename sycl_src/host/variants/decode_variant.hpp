// The decode kernel's variant policy (programs/flash_decode.hpp: split-KV attention over a KV
// cache for a few query rows per K/V head): its compiled head dim, query rows and key block,
// whether its scores run on the matrix engine, its local memory; how many K/V heads a
// work-group serves and how many splits of the keys a call runs. Whether a call takes this
// kernel at all is decode_or_general.hpp's choice; launch/decode_launch.hpp runs it.
#pragma once

#include <cstdint>
#include <string>

#include "host/variants/device_limits.hpp"
#include "host/variants/kernel_variant.hpp"
#include "host/variants/skip_reasons.hpp"
#include "device/decode/params.hpp"

namespace ipex_flash {

// Query rows one decode work-group serves at most (GQA group size x new tokens); more are cut
// into slices of this many (decode_row_slices, decode_or_general.hpp).
constexpr int kMaxDecodeRows = DECODE_LANES;

// Keys per online-softmax update (BLOCK_N): from kMinDecodeBlockKeys to kMaxDecodeBlockKeys.
// Splits of the keys are whole blocks, so a call over `keys` keys has at most most_splits(keys)
// splits that are not empty (Python reads both: C.DECODE_MIN_BLOCK_KEYS, C.most_splits).
constexpr int kMinDecodeBlockKeys = 16, kMaxDecodeBlockKeys = 64;
int64_t most_splits(int64_t keys);

// Bytes of one K/V element: the input's, or 1 for an FP8 cache (features).
int kv_element_bytes(const std::string& dtype, int features);

// The decode variant serving `rows` query rows per K/V head on a device with these limits,
// under IPEX_FLASH_MATRIX mode `mode`, for a cache whose key rows hold the heads side by side
// or not (`heads_interleaved`: (B, N, H, D) and paged caches, not (B, H, N, D)). head_dim is
// the larger of Q's and V's; with FEATURE_VALUE_DIM, head_dim_v is V's (MLA: 576 and 512; the
// register form compiles it, 0 leaves such calls to the vector form). Throws
// std::runtime_error when the device's local memory cannot hold the kernel's. why: the reason
// for each faster form it passes over (skip_reasons.hpp).
KernelVariant decode_variant(const std::string& dtype, int head_dim, int rows, int features,
                             bool heads_interleaved, const DeviceLimits& limits,
                             const std::string& mode, SkipReasons* why = nullptr,
                             int head_dim_v = 0);

// Whether the decode kernel fits the device's local memory for a call of this dtype, head dim
// (the larger of q's and v's), query rows per K/V head and features (an FP8 cache's): its
// smallest form, vector scores. It holds Q and O of up to 16 rows in float32, so past head
// dim 480 it outgrows the 64 KiB of Arc A-series, Meteor Lake and Arrow Lake-H; those calls
// take the general forward kernel (flash_decode_supported). why: where it does not, the reason.
bool decode_fits(const std::string& dtype, int head_dim, int rows, int features,
                 const DeviceLimits& limits, SkipReasons* why = nullptr);

// The program holding its kernels: the split kernel, then the merge kernel.
KernelProgram decode_program(const KernelVariant& variant);

// Whether the variant reads a bool attn_mask as bits (the register form, whose key blocks
// start at whole words): packed before it by the program's flash_mask_bits_kernel, the third.
bool decode_mask_bits(const KernelVariant& variant);

// Work-groups along the query rows of one K/V head (slices of kMaxDecodeRows rows).
int decode_row_slices(int rows);

// K/V heads one decode work-group serves: as many as its local memory holds the query rows
// of (rows = GQA group size x new tokens per K/V head; decode_row_capacity, one sub-group's
// on GPUs), so that on the CPU device it reads each key's heads together (contiguous in a
// (B, N, H, D) cache).
int decode_heads_per_group(int heads_kv, int rows, int head_dim, bool cpu_device);

// How many splits of the keys a call runs: `requested` > 0 (a caller's num_splits, a hint) as
// many, at most most_splits(max_len_k); 0 as many as make batch x head groups x splits
// work-groups fill a device of `compute_units` while each split keeps a few key blocks.
// head_dim: the larger of q's and v's; cpu_device: the kernels are built for the CPU device.
int decode_num_splits(int64_t requested, int batch, int heads_kv, int rows, int head_dim,
                      int64_t max_len_k, int compute_units, bool cpu_device);

}  // namespace ipex_flash
