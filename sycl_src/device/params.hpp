// Kernel parameters, shared verbatim by the host launcher (g++) and the device code
// (compiled at run time by the kernel compiler). Plain C++ only: no SYCL types here.
#pragma once

#include <cstdint>

namespace ipex_flash {

// Which keys a query row may see, as a band around a diagonal. With diag = 0 (top-left
// aligned, SDPA) or diag = len_k - len_q (bottom-right aligned, flash-attn), taken per
// sequence, query row r sees key c when
//   c <  len_k,
//   c <= r + diag + window_right   (if window_right >= 0),
//   c >= r + diag - window_left    (if window_left  >= 0).
// No mask: both windows -1. Causal: window_right 0. Sliding window (l, r): both set.
struct MaskParams {
  int32_t window_left;   // keys visible to the left of the diagonal, -1 = unbounded
  int32_t window_right;  // keys visible to the right of the diagonal, -1 = unbounded
  int32_t bottom_right;  // 1: diag = len_k - len_q; 0: diag = 0
};

// Compile-time feature bits of a kernel variant (the FEATURES template argument): code for a
// score change that a call does not use is not compiled in.
constexpr int FEATURE_SOFTCAP = 1;
constexpr int FEATURE_ALIBI = 2;
// A user's attention mask (attn_mask.hpp), one bit per element type: bool (false hides the
// key) or an additive float32 / float16 / bfloat16 bias.
constexpr int FEATURE_MASK_BOOL = 4;
constexpr int FEATURE_MASK_F32 = 8;
constexpr int FEATURE_MASK_F16 = 16;
constexpr int FEATURE_MASK_BF16 = 32;
constexpr int FEATURE_ATTN_MASK =
    FEATURE_MASK_BOOL | FEATURE_MASK_F32 | FEATURE_MASK_F16 | FEATURE_MASK_BF16;
// Softcap beside ALiBi or a user's mask. Those kernels take sycl::tanh, not the short form
// (score_mod.hpp: beside the other score changes IGC's schedule of it spilled), and on the
// 8-wide engines the SLM-staged kernels (flash_fwd_launch.cpp, flash_bwd_launch.cpp): host and
// device read this one rule, so a plan cannot drift from the tanh its kernel compiles.
constexpr bool softcap_beside_score_changes(int features) {
  return (features & FEATURE_SOFTCAP) != 0 &&
         (features & (FEATURE_ALIBI | FEATURE_ATTN_MASK)) != 0;
}
// An FP8 KV cache (kv_quant.hpp): K and V in float8_e4m3fn or float8_e5m2, q and out in T.
constexpr int FEATURE_KV_E4M3 = 64;
constexpr int FEATURE_KV_E5M2 = 128;
constexpr int FEATURE_KV_FP8 = FEATURE_KV_E4M3 | FEATURE_KV_E5M2;
// The decode kernel for V's head dim != Q's (dims.head_dim_v); without it the kernel treats
// them as one, which keeps its fp32 form within DG2's 128 registers (gpu-check).
constexpr int FEATURE_VALUE_DIM = 256;
// The decode kernel on the CPU device reads its keys as streams (decode_streams.hpp); set by
// the host for caches whose key rows hold the heads side by side.
constexpr int FEATURE_KEY_STREAMS = 512;
// The decode kernel first writes flash_attn_with_kvcache's new keys and values into the cache
// (decode_append.hpp, DecodeParams::append): a decode step that appends is one launch.
constexpr int FEATURE_APPEND = 1024;
// With FEATURE_APPEND, the rotary embedding of the new keys and of the queries (rotary.hpp),
// its tables in float32 or in the queries' dtype.
constexpr int FEATURE_ROTARY_F32 = 2048;
constexpr int FEATURE_ROTARY_INPUT = 4096;
constexpr int FEATURE_ROTARY = FEATURE_ROTARY_F32 | FEATURE_ROTARY_INPUT;

// Work-items of a decode work-group, and so the most query rows (GQA group size x new tokens)
// one decode work-group serves.
constexpr int DECODE_LANES = 16;

// Query rows (over all its K/V heads) a decode work-group of a kernel compiled for head_dim
// keeps Q and O of in local memory: 2 x 16 KB of float32, and at most 128 rows, whose running
// max and sum take another 2 x 8 KB, so that the whole fits the 64 KiB of Arc A-series and
// Meteor Lake GPUs at every head dim.
constexpr int decode_row_capacity(int head_dim) {
  return 4096 / head_dim > 128 ? 128 : 4096 / head_dim > DECODE_LANES ? 4096 / head_dim : DECODE_LANES;
}

// A mask the user passes (SDPA's attn_mask), broadcastable to (B, Hq, Nq, Nk) and read in
// place: a broadcast dimension has stride 0. Its element type is a FEATURE_MASK_* bit.
struct AttnMaskParams {
  const void* data;  // nullptr = none
  int64_t batch;     // byte strides
  int64_t head;
  int64_t row;
  int64_t col;
};

// Changes to the scaled scores before the softmax (flash-attn's and SDPA's options), in this
// order:
//   softcap > 0:  s = softcap * tanh(s / softcap)
//   ALiBi:        s -= slope[b, h] * |r + diag - c|
//   attn_mask:    s += mask[b, h, r, c] (float) or s = -inf where mask[b, h, r, c] is false
// Sinks (GPT-OSS) add exp(sink[h]) to every row's softmax denominator and nothing to its output.
struct ScoreModParams {
  float softcap;               // 0 = off
  const float* alibi_slopes;   // nullptr = off; (B, Hq) or (Hq,) float32
  int64_t alibi_batch_stride;  // 0 when the slopes are shared by the batch
  AttnMaskParams attn_mask;
  const float* sinks;          // nullptr = off; (Hq,) float32 logits
};

// Where each sequence's rows are. Fixed length: every pointer null, rows 0..len of each
// batch entry. Variable length: q and/or k packed along the row axis, sequence b at rows
// cu_seqlens[b] .. cu_seqlens[b+1]. A KV cache: seqlens_k[b] keys, optionally paged.
struct SeqLayout {
  const int32_t* cu_seqlens_q;  // (B + 1) or null
  const int32_t* cu_seqlens_k;  // (B + 1) or null
  const int32_t* seqlens_k;     // (B) keys per sequence or null
  const int32_t* block_table;   // (B, max_pages) page of each page_size keys, or null
  const int32_t* k_start;       // (B) or null: a cache's keys are rows k_start[b] .. seqlens_k[b]
  int64_t block_table_stride;   // elements between block_table rows
  int32_t page_size;            // keys per page (a multiple of 16) when paged
  int32_t keys_appended;        // added to each seqlens_k[b]: keys the kernel appends first
};

// A KV cache's bounds, so that out-of-range values (which a launch plan may leave to the
// device to check, cache_check.hpp) never take the decode kernel outside it: a sequence whose
// length or start is out of range has no keys (bounded_seq_info), a split whose block_table
// entries are not all pages of the pool reads nothing, and a new row whose page is not in the
// pool is not written (flash_decode.hpp, decode_append.hpp). Only
// DecodeParams holds it: in SeqLayout, which every kernel takes, the two words alone made the
// float32 forward spill on 128-register GPUs (gpu-check, Meteor Lake and Arrow Lake-H, d=128
// with every score change).
struct CacheBounds {
  int32_t key_capacity;  // rows a sequence's keys may reach
  int32_t pages;         // pages of a paged cache (0: not paged)
};

// The cache's bounds as the decode kernel obeys them, the check kernel (cache_check.hpp)
// reports them and the host checks them (launch_plan_values.cpp): a sequence's keys plus its
// appended rows within the capacity, its start within its keys, a block_table entry within
// the pool.
inline bool keys_fit_cache(int64_t keys, int64_t appended, int64_t capacity) {
  return keys >= 0 && keys + appended <= capacity;
}
inline bool start_within_keys(int64_t start, int64_t keys) { return start >= 0 && start <= keys; }
inline bool page_in_pool(int32_t page, int32_t pages) { return page >= 0 && page < pages; }

// Where a pack of the matrix kernels (fwd_pack_kv.hpp, bwd_packed.hpp) keeps each sequence's
// blocks of rows: per head, sequence after sequence, from pack_first_block (pack_rows.hpp).
struct PackRows {
  const int32_t* cu_rows;  // (B + 1) prefix sums of each sequence's rows, or null: every
                           // sequence has seq_blocks blocks (fixed length)
  int32_t seq_blocks;      // blocks per sequence without cu_rows
  int32_t blocks;          // blocks per head, all sequences and the gaps between them
};

// Element strides of one (B, H, N, D) tensor; the D stride is always 1. Packed varlen
// tensors are (1, H, total, D) with batch stride 0.
struct BhndStrides {
  int64_t batch;
  int64_t head;
  int64_t row;
};

// Dropout of attention probabilities (see dropout.hpp). Disabled when enabled == 0.
struct DropoutParams {
  uint64_t seed;       // Philox key, drawn from torch's generator for the device
  uint64_t offset;     // mixed into the counter, drawn from the same generator
  uint32_t threshold;  // a probability is dropped when its random word < threshold = p * 2^32
  float keep_scale;    // 1 / (1 - p): kept probabilities are scaled by it
  int32_t enabled;     // p > 0
};

// Problem sizes shared by every attention kernel. With variable lengths, len_q and len_k
// are the maxima over the batch (they size the launch).
struct AttentionDims {
  int32_t batch;         // B: sequences
  int32_t heads_q;       // Hq
  int32_t heads_per_kv;  // Hq / Hkv: query heads sharing one K/V head (GQA, MQA)
  int32_t len_q;         // Nq (max)
  int32_t len_k;         // Nk (max)
  int32_t head_dim;      // D: Q's and K's, at most the kernel's compiled HEAD_DIM
  int32_t head_dim_v;    // Dv: V's and O's (MLA: 128 with D = 192), also at most HEAD_DIM

  inline int32_t heads_kv() const { return heads_q / heads_per_kv; }  // Hkv
  // The kernel's HEAD_DIM covers both; columns past D (Q, K) or Dv (V, O) are zero padding.
  inline int32_t head_dim_max() const { return head_dim > head_dim_v ? head_dim : head_dim_v; }
};

// The log-sum-exp of row r of (b, h) is at lse[b * batch + h * head + row0(b) + r].
struct LseStrides {
  int64_t batch;
  int64_t head;
};

// Descale factors of an FP8 KV cache (kv_quant.hpp): float32 (B, Hkv), contiguous; null = 1.
struct KvDescaleParams {
  const float* k;
  const float* v;
};

// What every attention kernel shares: sizes, masks, score changes, sequence layout.
struct AttentionCommon {
  AttentionDims dims;
  SeqLayout seq;
  MaskParams mask;
  ScoreModParams score_mod;
  DropoutParams dropout;
  LseStrides lse_stride;
  KvDescaleParams kv_descale;
  float scale;          // softmax scale
  float q_prescale;     // what Q is multiplied by on load (see score_mod.hpp)
  int32_t num_blocks;   // work-groups per (batch, head) of the launch
};

struct FwdParams {
  const void* q;         // (B, Hq, Nq, D), input dtype
  const void* k;         // (B, Hkv, Nk, D), or pages (P, Hkv, page_size, D)
  const void* v;         // like k
  void* out;             // (B, Hq, Nq, Dv), input dtype
  float* lse;            // natural-log log-sum-exp, float32, see LseStrides
  BhndStrides q_stride;
  BhndStrides k_stride;  // paged: batch = elements between pages
  BhndStrides v_stride;
  BhndStrides out_stride;
  AttentionCommon common;
  // Matrix-engine kernel only: K and V^T in tile order (flash_fwd_matrix.hpp), written by its
  // pack kernel (fwd_pack_kv.hpp), BLOCK_N keys a block.
  void* kv_packed;
  PackRows kv_pack;
};

// The backward pass: delta = rowsum(dO * O) (preprocess), then dK and dV (one work-group per
// K/V block, summing over the query heads that share it, so no atomics), then dQ (one
// work-group per Q block).
struct BwdParams {
  const void* q;         // (B, Hq, Nq, D), input dtype
  const void* k;         // (B, Hkv, Nk, D)
  const void* v;         // (B, Hkv, Nk, Dv)
  const void* out;       // (B, Hq, Nq, Dv): the forward's output
  const void* dout;      // (B, Hq, Nq, Dv): gradient of the loss w.r.t. out
  void* dq;              // (B, Hq, Nq, D), input dtype
  void* dk;              // (B, Hkv, Nk, D)
  void* dv;              // (B, Hkv, Nk, Dv)
  const float* lse;      // the forward's log-sum-exp, see LseStrides
  float* delta;          // rowsum(dO * O), float32 scratch laid out like lse
  BhndStrides q_stride;
  BhndStrides k_stride;
  BhndStrides v_stride;
  BhndStrides out_stride;
  BhndStrides dout_stride;
  BhndStrides dq_stride;
  BhndStrides dk_stride;
  BhndStrides dv_stride;
  AttentionCommon common;  // dropout: the forward's, so the same elements are dropped
  // Matrix-engine kernels only (flash_bwd_matrix.hpp): K, K^T, V and the packed Q and dO
  // tiles, written by the pack kernels (bwd_packed.hpp): blocks of BLOCK_N keys, of BLOCK_M
  // query rows.
  void* packed;
  PackRows key_pack;
  PackRows row_pack;
};

// The rotary embedding flash_attn_with_kvcache applies to new keys and to the queries
// (rotary.hpp): a row's first rotary_dim features rotated at a position's row of the tables,
// pairs (2i, 2i + 1) when interleaved (GPT-J), else (i, i + rotary_dim / 2) (GPT-NeoX). New
// token i of sequence b is at seqlens[b] + i; query i too when q_positions_advance, else all
// queries at seqlens[b] (the lengths before the append, left pads included).
struct RotaryParams {
  const void* cos;  // (seqlen_ro, rotary_dim / 2), rows contiguous
  const void* sin;
  int64_t cos_stride;
  int32_t rotary_dim, interleaved, q_positions_advance;
  int32_t rows;     // the tables' rows: positions past them read the nearest (0: unchecked)
};

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

// The keep mask of a dropout configuration, materialised for tests (small shapes only).
struct DropoutMaskParams {
  uint8_t* keep;         // (B, Hq, Nq, Nk) contiguous: 1 kept, 0 dropped
  AttentionDims dims;
  DropoutParams dropout;
};

// New keys and values written into a KV cache (kv_append.hpp), as flash_attn_with_kvcache
// appends them: token i of sequence b at cache position seqlens[b] + i.
struct KvAppendParams {
  const void* k_new;            // (B, Nnew, Hkv, D), read through strides
  const void* v_new;            // (B, Nnew, Hkv, Dv)
  void* k_cache;                // (B_cache or pages, capacity or page_size, Hkv, D)
  void* v_cache;
  const int32_t* seqlens;       // (B): keys before the append
  const int32_t* block_table;   // (B, table_stride) pages, or null: cache row b is sequence b
  int32_t* seqlens_after;       // (B): seqlens + Nnew, the keys the attention then reads
  BhndStrides k_new_stride, v_new_stride, k_cache_stride, v_cache_stride;  // in elements
  int64_t table_stride;
  int32_t batch, new_tokens, heads, head_dim, head_dim_v, page_size;
  // 16-bit k_new, v_new into an FP8 cache (StoreFp8): their descales, (B, Hkv) float32 each.
  const float* k_descale;
  const float* v_descale;
  // Rotary embedding (kv_append_rotary_kernel): the new keys rotated before they are written,
  // and the queries into q_rotated.
  RotaryParams rotary;
  const void* q;
  void* q_rotated;
  BhndStrides q_stride, q_rotated_stride;
  int32_t heads_q, len_q;
};

// The check of a KV cache's values on the device (cache_check.hpp).
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
// smallest sub-groups, the CPU device's, have 4 lanes). A work-group reduction took 4-8 KiB on
// the GPUs (gpu-check).
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
