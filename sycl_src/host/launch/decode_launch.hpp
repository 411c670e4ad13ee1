// Host side of the decode kernel (programs/flash_decode.hpp): takes the variant its policy
// picks for the queue's device (variants/decode_variant.hpp), with the build guard's fallback,
// fills DecodeParams and launches the split and merge kernels. Which calls come here is
// variants/decode_or_general.hpp's choice.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <string>

#include "host/launch/attention_options.hpp"
#include "host/launch/tensor_view.hpp"
#include "host/variants/decode_or_general.hpp"
#include "host/variants/decode_variant.hpp"
#include "host/variants/kernel_variant.hpp"
#include "host/variants/skip_reasons.hpp"

namespace ipex_flash {

// out, lse of q (B, Hq, Nq, D) against a cache (options.seqlens_k, maybe block_table).
// partial_out (B, Hq, Nq, splits, Dv: v's head dim) and partial_lse (B, Hq, Nq, splits) are
// float32 scratch; their splits dimension sets the number of splits (decode_splits). With
// options.k_new, v_new (and maybe the rotary tables) the kernel appends them to the cache first
// (decode/append.hpp): q's dtype, at most kMaxDecodeRows query rows per K/V head. scratch:
// uint8, decode_scratch_bytes of them on the same device (none where that is 0), where the
// register form packs a bool attn_mask into bits before it runs.
void flash_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, const TensorView& lse, const TensorView& partial_out,
                  const TensorView& partial_lse, const AttentionOptions& options,
                  std::uintptr_t queue_handle, const TensorView& scratch = TensorView{});

// The bytes of flash_decode's scratch for this call: a bool attn_mask's bits where the
// variant reads them (decode_mask_bits), 0 otherwise.
int64_t decode_scratch_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& options, std::uintptr_t queue_handle);

// The splits of the keys a call runs on the queue's device (decode_num_splits: `requested`,
// at most most_splits(max_len_k), or for 0 as many as fill the device).
int decode_splits(int64_t requested, int batch, int heads_kv, int rows, int head_dim,
                  int64_t max_len_k, std::uintptr_t queue_handle);

// The variant decode_variant picks for the queue's device, under IPEX_FLASH_MATRIX, with its
// scores on the vector units where the device's compiler cannot build its matrix program. why:
// as decode_variant's, that fallback's included.
KernelVariant decode_variant_on(sycl::queue& queue, const std::string& dtype, int head_dim,
                                int rows, int features, bool heads_interleaved,
                                SkipReasons* why = nullptr, int head_dim_v = 0);

// The decode variant flash_decode runs for these tensors (q, k, v as (B, H, N, D) views) and
// options.
KernelVariant flash_decode_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AttentionOptions& options, std::uintptr_t queue_handle);

// Builds the decode kernels serving `rows` query rows per K/V head (GQA group size x new
// tokens, 1..kMaxDecodeRows) without running them (python -m ipex_flash warmup); head_dim_v,
// where V's head dim differs from q's and k's head_dim (MLA: 576 and 512; 0: the same).
KernelVariant warmup_decode(const std::string& dtype, int head_dim, int rows,
                            std::uintptr_t queue_handle, int head_dim_v = 0);

}  // namespace ipex_flash
