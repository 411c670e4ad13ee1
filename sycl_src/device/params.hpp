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
  int32_t batch;         // B
  int32_t heads_q;       // Hq
  int32_t heads_per_kv;  // Hq / Hkv: query heads sharing one K/V head (GQA, MQA)
  int32_t len_q;         // Nq
  int32_t len_k;         // Nk
  int32_t head_dim;      // D, at most the kernel's compiled HEAD_DIM
  int32_t num_q_blocks;  // ceil(Nq / BLOCK_M): work-groups per (batch, head)
  float scale_log2;      // softmax scale * log2(e): the kernel works in the exp2 domain
  MaskParams mask;
};

}  // namespace ipex_flash
