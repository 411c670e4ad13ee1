// What every backward kernel computes per score, between its two pairs of products: from the
// raw dot products q.k and dO.v, the probability the forward used (recomputed from its
// log-sum-exp) and dS, the gradient of the loss with respect to the score. Used by the matrix
// backward (backward/matrix_kernels.hpp), where a work-item owns one query row and walks its
// keys.
#pragma once

#include <sycl/sycl.hpp>

#include <limits>

#include "score/dropout.hpp"
#include "score/block_mask.hpp"
#include "common/params.hpp"
#include "backward/params.hpp"
#include "score/softcap_alibi.hpp"

namespace ipex_flash {

// The forward's LSE, kept in the exp2 domain (OnlineSoftmaxRow::log2_sum_exp); +inf for rows
// that must contribute nothing (padding rows past the sequence, rows that saw no key), so that
// exp2(score - it) == 0.
inline float lse_log2_or_inf(const float* lse, int64_t index, bool valid) {
  if (!valid) return std::numeric_limits<float>::infinity();
  const float value = lse[index];
  return value == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::infinity()
                                                         : value;
}

// One query row's softmax statistics, as the backward needs them.
struct BwdRowStats {
  float lse_log2;  // lse_log2_or_inf
  float delta;     // rowsum(dO * O)

  static inline BwdRowStats of(const BwdParams& p, const SeqInfo& seq, int batch, int head,
                               int64_t row) {
    const bool valid = row < seq.len_q;
    const int64_t index = lse_index(p.common, seq, batch, head, valid ? row : 0);
    return BwdRowStats{lse_log2_or_inf(p.lse, index, valid), valid ? p.delta[index] : 0.f};
  }
};

// For query row `row` against keys key0 .. key0 + N: on entry qk[j] = q.k (unscaled) and
// dp[j] = dO.v; on exit qk[j] = P after dropout (what multiplied V in the forward: dV's
// factor) and dp[j] = dS in the natural domain of scale * q.k (dK's and dQ's factor; the
// caller applies the softmax scale once at the end). fully_visible: the causal/window mask
// hides nothing in this block, so it is not applied element by element. GENERAL false: the
// lean form of a fully visible block without dropout (run_blocks, score/block_mask.hpp), with
// neither the mask's nor dropout's code. TANH: softcap's tanh (TanhForm); the register dQ takes
// FUSED with every score change. Where the forward took sycl::tanh (softcap beside ALiBi or a
// mask) the two differ by a few ulp of the score: a relative error near 1e-6 in the recomputed
// P, far inside the 16-bit dtypes these kernels serve. MASK_BITS: a bool mask is read as bits
// (AttnMaskPlane::key_bits), as the register dQ reads it.
template <int FEATURES, bool GENERAL = true, TanhForm TANH = default_tanh(FEATURES),
          bool MASK_BITS = false, int N>
inline void bwd_score_grads(const AttentionCommon& c, const ScoreMod& score_mod,
                            const BlockMask& mask, bool fully_visible, int64_t batch_head,
                            int64_t row, int64_t key0, const BwdRowStats& stats,
                            float (&qk)[N], float (&dp)[N]) {
  constexpr float UNIT = softcap_grad_unit(FEATURES, TANH);
  float softcap_grad[N];  // d score / d raw score, over UNIT
#pragma unroll
  for (int j = 0; j < N; ++j) qk[j] *= c.q_prescale * tanh_input_scale(FEATURES, TANH);
  score_mod.apply_to_row<FEATURES, TANH, MASK_BITS>(qk, softcap_grad, row, key0);
  if constexpr (GENERAL) {
    if (!fully_visible) mask.apply_to_keys(qk, row, key0);
  }
  float factor[N];  // dropout: 1/(1-p) kept, 0 dropped
#pragma unroll
  for (int j = 0; j < N; ++j) factor[j] = 1.f;
  if constexpr (GENERAL) {
    if (c.dropout.enabled)
      dropout_factors_for_keys<FEATURES>(dropout_draw<FEATURES>(c, batch_head),
          row, key0, factor);
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float prob = sycl::exp2(qk[j] - stats.lse_log2);
    qk[j] = prob * factor[j];
    // UNIT on dO.v - delta rather than on softcap_grad: one multiply-add either way.
    dp[j] = prob * (dp[j] * (factor[j] * UNIT) - stats.delta * UNIT);
    if constexpr ((FEATURES & FEATURE_SOFTCAP) != 0) dp[j] *= softcap_grad[j];
  }
}

}  // namespace ipex_flash
