// The register forward's scores (forward/registers_kernel.hpp): a lane's row against a block's
// keys, from the raw products of S^T's accumulators to the values its softmax exponentiates,
// in the form that costs its loop the fewest instructions.
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>
#include <limits>

#include "common/features.hpp"
#include "common/online_softmax.hpp"
#include "score/softcap_alibi.hpp"

namespace ipex_flash {

// What a block's loop holds between its scoring and its softmax:
//   SCORES: the exp2-domain scores (edge blocks, and lean ones with a mask).
//   DOTS: the products q.k, the scale left to the exponent's multiply-add (the plain kernel
//     and a bool mask up to d = 64: one instruction a score fewer).
//   SHIFTED: with ALiBi, on a lean block left of every row's diagonal, the scores less the
//     row's part of ALiBi (ScoreMod::apply_left_of_diagonal), which the max adds back.
//   COMPLEMENTS: with softcap alone, on a lean block, softcap's complements
//     r = 1 / (1 + exp2(x)) (TanhForm::FUSED), the score being c - 2 c r, c = softcap * log2(e)
//     > 0 (FEATURE_SOFTCAP is set for softcap > 0 only): the max from the least r, and the
//     multiply-add that makes the score is the exponent's (one instruction a score fewer).
enum class ScoreForm { SCORES, DOTS, SHIFTED, COMPLEMENTS };

template <int FEATURES, bool SCALE_IN_EXP, bool ALIBI_LEFT, bool GENERAL>
constexpr ScoreForm score_form() {
  constexpr int CHANGES = FEATURES & (FEATURE_SOFTCAP | FEATURE_ALIBI | FEATURE_ATTN_MASK);
  if constexpr (SCALE_IN_EXP) return ScoreForm::DOTS;
  if constexpr (GENERAL) return ScoreForm::SCORES;
  if constexpr (ALIBI_LEFT) return ScoreForm::SHIFTED;
  return CHANGES == FEATURE_SOFTCAP ? ScoreForm::COMPLEMENTS : ScoreForm::SCORES;
}

// dots: a chunk's products q.k, keys key0 + j (`offset` keys into the block), made the form's
// values in place.
template <int FEATURES, TanhForm TANH, bool MASK_BITS, ScoreForm FORM, int N>
__attribute__((always_inline)) inline void score_chunk(const ScoreMod& mod, float (&dots)[N],
                                                       float scale, int64_t row, int64_t key0,
                                                       int offset) {
  if constexpr (FORM == ScoreForm::SHIFTED) {
    mod.apply_left_of_diagonal<FEATURES, MASK_BITS>(dots, scale, row, key0, offset);
  } else if constexpr (FORM == ScoreForm::COMPLEMENTS) {
    static_assert(TANH == TanhForm::FUSED, "the complement of the fused tanh");
#pragma unroll
    for (int j = 0; j < N; ++j) dots[j] = fused_tanh_complement(dots[j] * scale);
  } else {
    if constexpr (FORM == ScoreForm::SCORES) {
#pragma unroll
      for (int j = 0; j < N; ++j) dots[j] *= scale;
    }
    if constexpr (FEATURES != 0) {  // DOTS: a bool mask's -inf alone
      float unused_grad[N];
      mod.apply_to_row<FEATURES, TANH, MASK_BITS>(dots, unused_grad, row, key0);
    }
  }
}

// A block's values in FORM: their max score, and each one's probability against the softmax.
template <ScoreForm FORM>
struct BlockScores {
  static constexpr bool LEAST = FORM == ScoreForm::COMPLEMENTS;  // the max is the least r
  float scale;    // DOTS: the products'
  float softcap;  // COMPLEMENTS: c
  float shift;    // SHIFTED: the row's part of ALiBi
  float folded = LEAST ? std::numeric_limits<float>::infinity() : NEG_INF;

  inline void fold(float value) {
    folded = LEAST ? sycl::fmin(folded, value) : sycl::fmax(folded, value);
  }

  inline float max_score() const {
    if constexpr (FORM == ScoreForm::DOTS) return folded * scale;
    if constexpr (FORM == ScoreForm::SHIFTED) return folded + shift;
    if constexpr (FORM == ScoreForm::COMPLEMENTS) return sycl::fma(-2.f * softcap, folded, softcap);
    return folded;
  }

  // exp2(score - base), base: the softmax's (OnlineSoftmaxRow::exp_base of its max).
  inline float probability(float value, float base) const {
    if constexpr (FORM == ScoreForm::DOTS) return sycl::exp2(sycl::fma(value, scale, -base));
    if constexpr (FORM == ScoreForm::SHIFTED) return sycl::exp2(value - (base - shift));
    if constexpr (FORM == ScoreForm::COMPLEMENTS)
      return sycl::exp2(sycl::fma(-2.f * softcap, value, softcap - base));
    return sycl::exp2(value - base);
  }
};

}  // namespace ipex_flash
