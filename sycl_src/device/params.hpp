// Kernel parameters, shared verbatim by the host launcher (g++) and the device code
// (compiled at run time by the kernel compiler). Plain C++ only: no SYCL types here.
#pragma once

#include <cstdint>

namespace ipex_flash {

// Which keys a query row may see, as bands around a diagonal. Query row r sees key c when
//   c <  len_k,
//   c <= r + diag_offset + window_right   (if window_right >= 0),
//   c >= r + diag_offset - window_left    (if window_left  >= 0).
// No mask: both windows -1. Causal (SDPA, top-left aligned): diag_offset 0, window_right 0.
struct MaskParams {
  int64_t diag_offset;   // key column on the diagonal of query row 0
  int32_t window_left;   // keys visible to the left of the diagonal, -1 = unbounded
  int32_t window_right;  // keys visible to the right of the diagonal, -1 = unbounded
};

// Element strides of one (B, H, N, D) tensor; the D stride is always 1.
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

// Problem sizes shared by every attention kernel.
struct AttentionDims {
  int32_t batch;         // B
  int32_t heads_q;       // Hq
  int32_t heads_per_kv;  // Hq / Hkv: query heads sharing one K/V head (GQA, MQA)
  int32_t len_q;         // Nq
  int32_t len_k;         // Nk
  int32_t head_dim;      // D, at most the kernel's compiled HEAD_DIM
};

struct FwdParams {
  const void* q;         // (B, Hq, Nq, D), input dtype
  const void* k;         // (B, Hkv, Nk, D), input dtype
  const void* v;         // (B, Hkv, Nk, D), input dtype
  void* out;             // (B, Hq, Nq, D), input dtype
  float* lse;            // (B, Hq, Nq), contiguous float32, natural-log log-sum-exp
  BhndStrides q_stride;
  BhndStrides k_stride;
  BhndStrides v_stride;
  BhndStrides out_stride;
  AttentionDims dims;
  int32_t num_q_blocks;  // ceil(Nq / BLOCK_M): work-groups per (batch, head)
  float scale_log2;      // softmax scale * log2(e): the kernel works in the exp2 domain
  MaskParams mask;
  DropoutParams dropout;
};

// The backward pass: delta = rowsum(dO * O) (preprocess), then dK and dV (one work-group per
// K/V block, summing over the query heads that share it, so no atomics), then dQ (one
// work-group per Q block).
struct BwdParams {
  const void* q;         // (B, Hq, Nq, D), input dtype
  const void* k;         // (B, Hkv, Nk, D)
  const void* v;         // (B, Hkv, Nk, D)
  const void* out;       // (B, Hq, Nq, D): the forward's output
  const void* dout;      // (B, Hq, Nq, D): gradient of the loss w.r.t. out
  void* dq;              // (B, Hq, Nq, D), input dtype
  void* dk;              // (B, Hkv, Nk, D)
  void* dv;              // (B, Hkv, Nk, D)
  const float* lse;      // (B, Hq, Nq) contiguous: the forward's log-sum-exp
  float* delta;          // (B, Hq, Nq) contiguous scratch: rowsum(dO * O)
  BhndStrides q_stride;
  BhndStrides k_stride;
  BhndStrides v_stride;
  BhndStrides out_stride;
  BhndStrides dout_stride;
  BhndStrides dq_stride;
  BhndStrides dk_stride;
  BhndStrides dv_stride;
  AttentionDims dims;
  int32_t num_blocks;    // work-groups per (batch, head): Q blocks for dQ, K blocks for dK/dV
  float scale;           // softmax scale (dS -> dQ, dK)
  float scale_log2;      // scale * log2(e)
  MaskParams mask;
  DropoutParams dropout;  // the forward's, so the same elements are dropped
};

// The keep mask of a dropout configuration, materialised for tests (small shapes only).
struct DropoutMaskParams {
  uint8_t* keep;         // (B, Hq, Nq, Nk) contiguous: 1 kept, 0 dropped
  AttentionDims dims;
  DropoutParams dropout;
};

}  // namespace ipex_flash
