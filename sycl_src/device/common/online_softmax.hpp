// Online softmax state of one query row (Milakov & Gimelshein 2018), in the exp2 domain:
// scores arrive already multiplied by scale * log2(e), so exp(x * scale) == exp2(score).
#pragma once

#include <sycl/sycl.hpp>

#include <limits>

namespace ipex_flash {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
constexpr float LOG2E = 1.44269504088896340736f;  // scores in the exp2 domain: x * scale * log2(e)

struct OnlineSoftmaxRow {
  float row_max = NEG_INF;  // running max of the scores seen so far
  float row_sum = 0.f;        // running sum of exp2(score - row_max)

  // Raises the running max to cover `block_max` and rescales the running sum to it. Returns
  // the factor by which everything accumulated against the old max must be rescaled.
  inline float raise_max(float block_max) {
    const float new_max = sycl::fmax(row_max, block_max);
    const float rescale = sycl::exp2(row_max - exp_base(new_max));
    row_sum *= rescale;
    row_max = new_max;
    return rescale;
  }

  // FlashAttention-4's lazy rescale: raises the running max only where `block_max` passes it by
  // more than `threshold` (log2 units: a factor of 2^threshold), else keeps it and returns 1,
  // so that a block whose max rises a little leaves what was accumulated as it is. The max is
  // then a reference at most `threshold` below the true one: probabilities against it reach
  // 2^threshold, not 1, and the row sum, the output's normalisation and the log-sum-exp all
  // use the same reference, so the result is the same sum in exact arithmetic; only its
  // rounding differs (a 16-bit P keeps its relative precision at any magnitude). The caller
  // keeps 2^threshold times what multiplies P inside the 16-bit range (dropout's 1 / (1 - p)
  // can pass it: threshold 0 there). Returns 1 also where nothing was accumulated (the max
  // still -inf: the sum and the caller's products are 0), so a row's first block does not
  // rescale. The difference, not a sum, is compared: row_max + threshold can round past
  // threshold's own distance where |row_max| is large, -inf - -inf is NaN (not raised).
  // Selects, not a branch: each lane decides alone, and IGC made the branch divergent control
  // flow that copied the scores' registers (64 more moves a block on BMG at d = 64).
  inline float raise_max_past(float block_max, float threshold) {
    const bool raise = block_max - row_max > threshold;
    const float new_max = raise ? block_max : row_max;
    const float factor = sycl::exp2(row_max - exp_base(new_max));
    const float rescale = (raise & (row_max != NEG_INF)) ? factor : 1.f;  // &: no branch
    row_sum *= rescale;
    row_max = new_max;
    return rescale;
  }

  // exp2(score - max) of a score already covered by raise_max; the caller adds it to row_sum.
  inline float probability(float score) const { return sycl::exp2(score - exp_base(row_max)); }

  // The same of the score dot * scale (scale > 0), the multiply fused into the subtraction.
  inline float probability(float dot, float scale) const {
    return sycl::exp2(sycl::fma(dot, scale, -exp_base(row_max)));
  }

  // Folds a chunk of scores into the running state and turns them into unnormalised
  // probabilities exp2(score - new_max). Returns the rescale factor of raise_max.
  template <int N>
  inline float update(float (&scores)[N]) {
    float chunk_max = scores[0];
#pragma unroll
    for (int j = 1; j < N; ++j) chunk_max = sycl::fmax(chunk_max, scores[j]);
    const float rescale = raise_max(chunk_max);
    float chunk_sum = 0.f;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      scores[j] = probability(scores[j]);
      chunk_sum += scores[j];
    }
    row_sum += chunk_sum;
    return rescale;
  }

  // 1 / row_sum, or 0 for a row that saw no key (its output is then 0, as in flash-attn).
  inline float inverse_sum() const { return row_sum > 0.f ? 1.f / row_sum : 0.f; }

  // A row that so far has seen only masked keys keeps max -inf; subtracting -inf from -inf
  // would give NaN, so exponentiate against 0 instead (every term is then 0).
  static inline float exp_base(float max) { return max == NEG_INF ? 0.f : max; }

  // The row's log-sum-exp in the exp2 domain (log2 of the sum of exp2(score)), -inf for a row
  // that saw no key. The kernels keep it in these units: the backward then recomputes each
  // probability as exp2(score - it) from the very score the forward used, with no round trip
  // through the natural log (a row of one key gets exactly 1). Callers convert to the natural
  // log (times ln 2) where a user sees it.
  inline float log2_sum_exp() const {
    if (!(row_sum > 0.f)) return NEG_INF;
    return row_max + sycl::log2(row_sum);
  }
};

}  // namespace ipex_flash
