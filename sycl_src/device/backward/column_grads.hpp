// bwd_score_grads (backward/score_grads.hpp) in the form of the register dK/dV kernel
// (backward/dkdv_registers_kernel.hpp), where a lane owns key `key` against query rows
// row0 .. row0 + N whose statistics it holds element by element. In two steps around the dV
// product: the scores' and dO.v's tiles are then never live together beside the resident dK^T
// and dV^T (at d = 64 with softcap, ALiBi and a mask, together they spilled on BMG).
#pragma once

#include <sycl/sycl.hpp>

#include "score/dropout.hpp"
#include "score/block_mask.hpp"
#include "common/params.hpp"
#include "score/softcap_alibi.hpp"

namespace ipex_flash {

// softcap_grad's unit in these steps (softcap_grad_unit): the caller multiplies the rows' delta
// by it as it loads them, once a row, and step 2 dO.v, in the multiply-add it makes anyway.
template <int FEATURES>
constexpr float bwd_column_unit = softcap_grad_unit(FEATURES, TanhForm::FUSED);

// Step 1. On entry prob[j] = q.k (unscaled); on exit prob[j] = P before dropout,
// softcap_grad[j] = d score / d (scale * q.k) over bwd_column_unit where FEATURES has softcap,
// and dropped[j] = P after dropout (what multiplied V in the forward: dV's factor). LANES: the
// sub-group's. GENERAL false, here and below: the lean form of a fully visible block without
// dropout (run_blocks, score/block_mask.hpp), with neither the mask's nor dropout's code.
// Softcap's tanh is the FUSED one with every score change (TanhForm).
template <int FEATURES, int LANES, bool GENERAL = true, int N>
inline void bwd_column_probabilities(sycl::sub_group sg, const AttentionCommon& c,
                                     const ScoreMod& score_mod, const BlockMask& mask,
                                     bool fully_visible,
                                     int64_t batch_head, int64_t row0, int64_t key,
                                     const float (&lse_log2)[N], float (&prob)[N],
                                     float (&softcap_grad)[N], float (&dropped)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) prob[j] *= c.q_prescale * tanh_input_scale(FEATURES, TanhForm::FUSED);
  if constexpr ((FEATURES & FEATURE_MASK_BOOL) != 0) {  // the mask as bits
    score_mod.apply_from<FEATURES, TanhForm::FUSED>(prob, softcap_grad,
                                                    score_mod.distance(row0, key), 1.f);
    score_mod.attn_mask.hide_rows_by_bits(sg, prob, row0, key);
  } else if constexpr (FEATURES != 0) {
    score_mod.apply<FEATURES, TanhForm::FUSED>(prob, softcap_grad, row0, key, 1, 0);
  }
  if constexpr (GENERAL) {
    if (!fully_visible) mask.apply_to_rows(prob, row0, key);
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    prob[j] = sycl::exp2(prob[j] - lse_log2[j]);
    dropped[j] = prob[j];
  }
  if constexpr (GENERAL) {
    if (c.dropout.enabled) {
      const uint32_t kept =
          dropout_kept_rows<N, LANES, FEATURES>(sg, dropout_draw<FEATURES>(c, batch_head),
              row0, key);
#pragma unroll
      for (int j = 0; j < N; ++j)
        dropped[j] *= (kept >> j & 1) != 0 ? c.dropout.keep_scale : 0.f;
    }
  }
}

// Step 2. On entry dp[j] = dO.v and delta[j] = rowsum(dO * O) * bwd_column_unit<FEATURES>; on
// exit dS in the natural domain of scale * q.k (dK's factor; the caller applies the softmax
// scale once at the end). The dropout factors are drawn again rather than kept across the
// products.
template <int FEATURES, int LANES, bool GENERAL = true, int N>
inline void bwd_column_dscores(sycl::sub_group sg, const AttentionCommon& c, int64_t batch_head,
                               int64_t row0, int64_t key, const float (&prob)[N],
                               const float (&softcap_grad)[N], const float (&delta)[N],
                               float (&dp)[N]) {
  if constexpr (GENERAL) {
    if (c.dropout.enabled) {
      const uint32_t kept =
          dropout_kept_rows<N, LANES, FEATURES>(sg, dropout_draw<FEATURES>(c, batch_head),
              row0, key);
#pragma unroll
      for (int j = 0; j < N; ++j) dp[j] *= (kept >> j & 1) != 0 ? c.dropout.keep_scale : 0.f;
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    dp[j] = prob[j] * (dp[j] * bwd_column_unit<FEATURES> - delta[j]);
    if constexpr ((FEATURES & FEATURE_SOFTCAP) != 0) dp[j] *= softcap_grad[j];
  }
}

// Step 2 where P after dropout is still at hand (dropped, from step 1): the dropout factors
// are read off it instead of drawn again (a kept element is P times 1/(1-p), a dropped one 0;
// where P itself is 0, dS is 0 with either factor). The dK/dV kernel's pass for dK alone does
// so: drawing them twice there, beside dK^T's 128 registers at d = 128, spilled.
template <int FEATURES, bool GENERAL = true, int N>
inline void bwd_column_dscores_kept(const AttentionCommon& c, const float (&prob)[N],
                                    const float (&dropped)[N], const float (&softcap_grad)[N],
                                    const float (&delta)[N], float (&dp)[N]) {
  if constexpr (GENERAL) {
    if (c.dropout.enabled) {
#pragma unroll
      for (int j = 0; j < N; ++j) dp[j] *= dropped[j] != 0.f ? c.dropout.keep_scale : 0.f;
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    dp[j] = prob[j] * (dp[j] * bwd_column_unit<FEATURES> - delta[j]);
    if constexpr ((FEATURES & FEATURE_SOFTCAP) != 0) dp[j] *= softcap_grad[j];
  }
}

}  // namespace ipex_flash
