// The decode-or-general choice, made here only: which forward calls the split-KV decode kernel
// serves (decode_variant.hpp), the rest going to the general forward kernel
// (forward_variant.hpp), which also reads KV caches. The Python entry points (ops/launch.py's
// run_forward, ops/varlen_decode.py, the serving calls) and the launch plans
// (plans/launch_plan.hpp) ask these functions (C.takes_decode_kernel, C.flash_decode_supported,
// C.max_sliced_decode_tokens).
#pragma once

#include <cstdint>

#include "host/launch/attention_options.hpp"
#include "host/launch/tensor_view.hpp"
#include "host/variants/skip_reasons.hpp"

namespace ipex_flash {

// A K/V head's query rows (GQA group size x new tokens) past kMaxDecodeRows (decode_variant.hpp)
// (MQA, speculative drafts, short chunks) are served by several work-groups, each taking a
// slice of kMaxDecodeRows rows and reading the keys itself, when there are at most
// max_sliced_decode_tokens(heads_kv) new tokens; otherwise the general forward kernel (which
// also reads paged caches) is used. The general kernel reads the keys once per query head
// whatever its few rows (a Q block of mostly padding), the slices once per slice. On the CPU
// device (B=2, causal, same process) slices won 1.6-7.5x with 8 or 16 new tokens in all 12
// cases (MQA 32/1, 128/1, GQA 32/8, 64/8; fp32 and bf16; 8k keys, and 64k once), with 32 won
// 1.3-2.0x on one or two K/V heads and lost 0.8-0.9x on four or eight, and with 64 lost or tied
// (0.4-1.0x).
constexpr int kMaxSlicedDecodeTokens = 16;
constexpr int kMaxSlicedDecodeTokensFewHeads = 32;  // with at most kFewKvHeads K/V heads
constexpr int kFewKvHeads = 2;
inline int max_sliced_decode_tokens(int64_t heads_kv) {
  return heads_kv <= kFewKvHeads ? kMaxSlicedDecodeTokensFewHeads : kMaxSlicedDecodeTokens;
}

// Whether the decode kernel serves `rows` query rows per K/V head (GQA group size x new
// tokens), `new_tokens` per sequence, with `heads_kv` K/V heads (above). why: where it does
// not, the reason.
bool decode_serves_rows(int64_t rows, int64_t new_tokens, int64_t heads_kv,
                        SkipReasons* why = nullptr);

// Whether flash_decode serves q (B, Hq, Nq, D) against this cache: the query rows per K/V head
// (decode_serves_rows), the kernel's local memory at the head dim (decode_fits: past 480 on
// GPUs with 64 KiB) and, for 16-bit and FP8 caches, rows starting on 4-byte boundaries and
// head dims (q's and v's) in whole 4-byte words. Other problems go to flash_fwd (which also
// reads caches). FP8 caches take the decode kernel only where it has the large register file
// (or on the CPU device): with 128 registers its FP8 conversions spill on Meteor Lake and,
// past 8 rows per K/V head, on every such GPU (gpu-check's record, docs/gpus.md); the general
// kernel serves them there.
bool flash_decode_supported(const TensorView& q, const TensorView& k, const TensorView& v,
                            std::uintptr_t queue_handle);

// The choice for a forward call of q (B, Hq, Nq, D) against k, v (B, Hkv, Nk, D) or a cache seen
// so: the decode kernel where flash_decode_supported and the call has no dropout (which only
// the general kernel draws), no packed queries (options.cu_seqlens_q) and no backward to follow
// (backward_follows: the backward kernels recompute the forward's scores in the general
// kernel's order of operations; the decode kernel sums q.k in another); the general otherwise.
bool takes_decode_kernel(const TensorView& q, const TensorView& k, const TensorView& v,
                         const AttentionOptions& options, bool backward_follows,
                         std::uintptr_t queue_handle);

}  // namespace ipex_flash
