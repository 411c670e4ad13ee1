// Softcap and ALiBi, applied where the scores are made, in the exp2 domain. Q is loaded
// multiplied by AttentionCommon::q_prescale, so a dot product x = q.k * q_prescale is
//   without softcap: scale * log2(e) * q.k       (already the exp2-domain score)
//   with softcap:    scale / softcap * q.k       (score = softcap * log2(e) * tanh(x))
// and ALiBi then subtracts slope * log2(e) * |r + diag - c|.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <utility>

#include "params.hpp"
#include "seq_info.hpp"

namespace ipex_flash {

constexpr float LOG2E = 1.44269504088896340736f;

struct ScoreMod {
  float softcap_log2;  // softcap * log2(e); 0 = off
  float alibi_log2;    // this (batch, head)'s ALiBi slope * log2(e); 0 = off
  int64_t diag;        // the sequence's diagonal (ALiBi distances are measured from it)

  static inline ScoreMod of(const AttentionCommon& c, const SeqInfo& seq, int b, int h) {
    const ScoreModParams& p = c.score_mod;
    const float slope =
        p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;
    return ScoreMod{p.softcap * LOG2E, slope * LOG2E, seq.diag};
  }

  // Turns dot products into scores for a kernel compiled with FEATURES; softcap_grad[j]
  // receives d score / d (scale * q.k) in the natural domain (1 - tanh^2), which the backward
  // needs when FEATURES has FEATURE_SOFTCAP. row_key(j) gives the (row, key) of element j.
  template <int FEATURES, int N, typename RowKey>
  inline void apply(float (&scores)[N], float (&softcap_grad)[N], RowKey row_key) const {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if constexpr ((FEATURES & FEATURE_SOFTCAP) != 0) {
        const float t = sycl::tanh(scores[j]);
        softcap_grad[j] = 1.f - t * t;
        scores[j] = softcap_log2 * t;
      }
      if constexpr ((FEATURES & FEATURE_ALIBI) != 0) {
        const auto [row, key] = row_key(j);
        scores[j] -= alibi_log2 * sycl::fabs(static_cast<float>(row + diag - key));
      }
    }
  }
};

}  // namespace ipex_flash
