// The parameters every kernel family shares: dimensions, strides, sequence layout, mask,
// score changes, dropout, FP8 descales (AttentionCommon), and the feature bits.
// Shared verbatim by the host launchers (g++) and the device code (compiled at run time by the
// kernel compiler). Plain C++ only: no SYCL types here.
#pragma once

#include <cstdint>

#include "common/features.hpp"

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

// A mask the user passes (SDPA's attn_mask), broadcastable to (B, Hq, Nq, Nk) and read in
// place: a broadcast dimension has stride 0. Its element type is a FEATURE_MASK_* bit.
struct AttnMaskParams {
  const void* data;  // nullptr = none
  int64_t batch;     // byte strides
  int64_t head;
  int64_t row;
  int64_t col;
};

// A bool attn_mask as bits, a 32-bit word per 32 keys (score/mask_bits_kernel.hpp), which
// the register kernels read: packed before them (FwdParams::mask_bits, BwdParams::mask_bits;
// kept out of AttnMaskParams, whose size every kernel's parameters carry: 32 bytes more made
// the 8-wide decode kernel spill).
struct MaskBitsParams {
  uint32_t* words;  // null: not packed
  int64_t batch;    // word strides, 0 for a broadcast dimension
  int64_t head;
  int64_t row;
};

// Words a row of a bool attn_mask packed as bits holds: its keys' up to the end of the last
// block of block_n keys, so that a kernel's block reads whole words without a bounds test.
constexpr int64_t mask_bits_words(int64_t len_k, int block_n) {
  const int64_t blocks = (len_k + block_n - 1) / block_n;
  return (blocks * block_n + 31) / 32;
}

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

// A KV cache's bounds, so that out-of-range values (which a launch plan may leave to the device to
// check, probes/cache_check_kernel.hpp) never take the decode kernel outside it: a sequence whose
// length or start is out of range has no keys (bounded_seq_info), a split whose block_table entries
// are not all pages of the pool reads nothing, and a new row whose page is not in the pool is not
// written (decode/kernel.hpp, decode/append.hpp). Only DecodeParams holds it: in SeqLayout, which
// every kernel takes, the two words alone made the float32 forward spill on 128-register GPUs
// (gpu-check, Meteor Lake and Arrow Lake-H, d=128 with every score change).
struct CacheBounds {
  int32_t key_capacity;  // rows a sequence's keys may reach
  int32_t pages;         // pages of a paged cache (0: not paged)
};

// The cache's bounds as the decode kernel obeys them, the check kernel
// (probes/cache_check_kernel.hpp) reports them and the host checks them
// (host/plans/launch_plan_checks.cpp): a sequence's keys plus its appended rows within the
// capacity, its start within its keys, a block_table entry within the pool.
inline bool keys_fit_cache(int64_t keys, int64_t appended, int64_t capacity) {
  return keys >= 0 && keys + appended <= capacity;
}
inline bool start_within_keys(int64_t start, int64_t keys) { return start >= 0 && start <= keys; }
inline bool page_in_pool(int32_t page, int32_t pages) { return page >= 0 && page < pages; }

// Where a pack of the matrix kernels (forward/pack_kv.hpp, backward/pack_operands.hpp) keeps each
// sequence's blocks of rows: per head, sequence after sequence, from pack_first_block
// (matrix/pack_rows.hpp).
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

// Dropout of attention probabilities (see score/dropout.hpp). Disabled when enabled == 0.
struct DropoutParams {
  uint64_t seed;       // Philox key, drawn from torch's generator for the device
  uint64_t offset;     // mixed into the counter, drawn from the same generator
  uint32_t threshold;  // a probability is dropped when its random word < threshold = p * 2^32
  float keep_scale;    // 1 / (1 - p): kept probabilities are scaled by it
  int32_t enabled;     // p > 0
};

// Where a call's sequences, heads, rows and keys sit in a larger attention, of which the call
// is one block (a rank's queries against one K/V shard of a ring): its mask (causal, window)
// and ALiBi are measured from the global diagonal (SeqInfo::diag), and dropout draws its
// keep-mask at these global positions, so that the blocks together see, bias and keep
// exactly what one call over the whole problem would. One pointer: every byte the kernels'
// arguments grew by made the register forward with every score change spill more on PVC
// (704 bytes before, 768 with a pointer, 1024 with the header's fields as arguments).
struct GlobalPositions {
  // nullptr: the call is the whole problem. Else int64 {header: table_stride (3, or 0: one
  // entry for every sequence), the global query head of the call's head 0, the whole
  // problem's query heads, 0}, then per sequence b at entry(b): {its global sequence minus
  // b, the global position of its query row 0, that of its key 0}.
  const int64_t* table;

  inline const int64_t* entry(int64_t b) const { return table + 4 + b * table[0]; }
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

// Descale factors of an FP8 KV cache (common/kv_quant.hpp): float32 (B, Hkv), contiguous; null = 1.
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
  GlobalPositions positions;
  LseStrides lse_stride;
  KvDescaleParams kv_descale;
  float scale;          // softmax scale
  float q_prescale;     // what Q is multiplied by on load (see score/softcap_alibi.hpp)
  int32_t num_blocks;   // work-groups per (batch, head) of the launch
};

// The bool mask's packing into bits (score/mask_bits_kernel.hpp): the call's sizes, the mask
// as given, and where its bits go.
struct MaskBitsPackParams {
  AttentionDims dims;
  AttnMaskParams mask;
  MaskBitsParams bits;
};

}  // namespace ipex_flash
