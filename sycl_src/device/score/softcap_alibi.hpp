// Softcap and ALiBi, applied where the scores are made, in the exp2 domain. Q is loaded
// multiplied by AttentionCommon::q_prescale, so a dot product x = q.k * q_prescale is
//   without softcap: scale * log2(e) * q.k       (already the exp2-domain score)
//   with softcap:    scale / softcap * q.k       (score = softcap * log2(e) * tanh(x))
// and ALiBi then subtracts slope * log2(e) * |r + diag - c|; the user's mask comes last
// (score/tensor_mask.hpp).
#pragma once

#include <sycl/sycl.hpp>

#include <cstdint>

#include "score/tensor_mask.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "common/seq_info.hpp"

namespace ipex_flash {

// softcap's tanh from one exp2 and one reciprocal: tanh(x) = 1 - 2r and
// 1 - tanh(x)^2 = 4r(1 - r), with r = 1 / (1 + exp(2x)) (0 where exp overflows, 1 where it
// underflows: tanh +-1). sycl::tanh compiles (IGC) to a long sequence of instructions an
// element, which made the register forward's loop issue many times the instructions per DPAS it
// issues without softcap (BMG at d = 64; docs/gpus.md). The error is a few ulp of 1 absolute:
// what the scores, softcap * tanh, and their softmax see (as 1 - t * t, the derivative's error
// was absolute too). The forward and the SLM-staged backward take it with softcap alone: with
// ALiBi or a mask as well, IGC's schedule of it spilled where sycl::tanh's did not (in BMG's
// register forward at d = 128, and in DG2's and Arrow Lake-H's SLM-staged backward; gpu-check's
// record). The register backward takes it with every score change (backward/score_grads.hpp).
inline float tanh_complement(float x) { return 1.f / (1.f + sycl::exp2(2.f * LOG2E * x)); }
// The same of x already multiplied by 2 log2(e) (TanhForm::FUSED).
inline float fused_tanh_complement(float x2) { return 1.f / (1.f + sycl::exp2(x2)); }

// How ScoreMod::apply computes softcap's tanh, and what it hands back as softcap_grad:
//   LIBRARY: sycl::tanh t; softcap_grad = 1 - t^2.
//   SHORT: tanh_complement's r; softcap_grad = 4r(1 - r), the same.
//   FUSED: r, from scores that arrive multiplied by 2 log2(e) as well (tanh_input_scale: the
//     caller folds it into the multiply it makes anyway), and softcap_grad = r(1 - r), a
//     quarter of 1 - t^2 (softcap_grad_unit: the caller folds the 4 into dS's other factor).
//     Three instructions fewer an element than SHORT, in the register backward's main loops.
// By default LIBRARY beside ALiBi or a mask, where IGC's schedule of SHORT spilled in the
// forward and the SLM-staged backward (above); the register backward takes FUSED with every
// score change (backward/score_grads.hpp).
enum class TanhForm { LIBRARY, SHORT, FUSED };

constexpr TanhForm default_tanh(int features) {
  return softcap_beside_score_changes(features) ? TanhForm::LIBRARY : TanhForm::SHORT;
}

// What a caller multiplies the dot products by, besides q_prescale, before ScoreMod::apply.
constexpr float tanh_input_scale(int features, TanhForm tanh) {
  return (features & FEATURE_SOFTCAP) != 0 && tanh == TanhForm::FUSED ? 2.f * LOG2E : 1.f;
}

// d score / d (scale * q.k) = softcap_grad * softcap_grad_unit.
constexpr float softcap_grad_unit(int features, TanhForm tanh) {
  return (features & FEATURE_SOFTCAP) != 0 && tanh == TanhForm::FUSED ? 4.f : 1.f;
}

struct ScoreMod {
  float softcap_log2;  // softcap * log2(e); 0 = off
  float alibi_log2;    // this (batch, head)'s ALiBi slope * log2(e); 0 = off
  int64_t diag;        // the sequence's diagonal (ALiBi distances are measured from it)
  AttnMaskPlane attn_mask;  // this (batch, head)'s plane of the user's mask

  static inline ScoreMod of(const AttentionCommon& c, const SeqInfo& seq, int b, int h) {
    const ScoreModParams& p = c.score_mod;
    const float slope =
        p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;
    return ScoreMod{p.softcap * LOG2E, slope * LOG2E, seq.diag, AttnMaskPlane::of(c, seq, b, h)};
  }

  // The same for the register kernels, which read a bool mask as its packed bits.
  static inline ScoreMod of(const AttentionCommon& c, const SeqInfo& seq, int b, int h,
                            const MaskBitsParams& bits) {
    ScoreMod mod = of(c, seq, b, h);
    mod.attn_mask = mod.attn_mask.with_bits(bits, b, h);
    return mod;
  }

  // The online softmax a row of head h starts from: empty, or holding head h's sink (a logit
  // in the denominator with no value: exp2(sink - max) counts in the sum from the start).
  static inline OnlineSoftmaxRow start_row(const AttentionCommon& c, int h) {
    OnlineSoftmaxRow row;
    if (c.score_mod.sinks != nullptr) {
      row.row_max = c.score_mod.sinks[h] * LOG2E;
      row.row_sum = row.row_max > NEG_INF ? 1.f : 0.f;
    }
    return row;
  }

  // Turns dot products into scores for a kernel compiled with FEATURES; softcap_grad[j]
  // receives d score / d (scale * q.k) in the natural domain (1 - tanh^2), which the backward
  // needs when FEATURES has FEATURE_SOFTCAP. Element j is (row0 + j * row_step,
  // key0 + j * key_step): a work-item's row against consecutive keys (0, 1), or its key against
  // consecutive rows (1, 0).
  // TANH: how softcap's tanh is computed (TanhForm).
  template <int FEATURES, TanhForm TANH = default_tanh(FEATURES), int N>
  inline void apply(float (&scores)[N], float (&softcap_grad)[N], int64_t row0, int64_t key0,
                    int row_step, int key_step) const {
    apply_from<FEATURES, TANH>(scores, softcap_grad, distance(row0, key0),
                                     static_cast<float>(row_step - key_step));
    attn_mask.apply<FEATURES>(scores, row0, key0, row_step, key_step);
  }

  // apply for a lane's row against consecutive keys, reading a bool mask as its packed bits
  // where MASK_BITS (the register kernels: with_bits), in place otherwise.
  template <int FEATURES, TanhForm TANH, bool MASK_BITS, int N>
  inline void apply_to_row(float (&scores)[N], float (&softcap_grad)[N], int64_t row,
                           int64_t key0) const {
    if constexpr (MASK_BITS && (FEATURES & FEATURE_MASK_BOOL) != 0) {
      apply_from<FEATURES, TANH>(scores, softcap_grad, distance(row, key0), -1.f);
      AttnMaskPlane::hide_by_bits(scores, attn_mask.key_bits(row, key0));
    } else if constexpr (FEATURES != 0) {
      apply<FEATURES, TANH>(scores, softcap_grad, row, key0, 0, 1);
    }
  }

  // apply_to_row on a block of the forward's lean loop that no row passes the diagonal of
  // (every key at most row + diag: BlockMask::left_of_diagonal), key0 = block_key0 + offset,
  // from the raw products `dots` and the scale (with softcap, TanhForm::FUSED's). ALiBi's
  // -slope * (row + diag - key) is -slope * (row + diag - block_key0), the row's alone, plus
  // slope * (offset + j), the same for every lane: the first is left to the caller, who shifts
  // the softmax by it (alibi_row_shift); the second is the addend of the multiply-add that
  // scales the score, or of softcap's. No distance per element, and no instruction past those
  // of the scale and softcap; the scores differ from apply_to_row's by rounding, by a shift
  // exact per row.
  template <int FEATURES, bool MASK_BITS, int N>
  inline void apply_left_of_diagonal(float (&dots)[N], float scale, int64_t row, int64_t key0,
                                     int offset) const {
    static_assert((FEATURES & FEATURE_ALIBI) != 0, "ALiBi's split form");
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float alibi = alibi_log2 * static_cast<float>(offset + j);
      if constexpr ((FEATURES & FEATURE_SOFTCAP) != 0)
        dots[j] = sycl::fma(-2.f * softcap_log2, fused_tanh_complement(dots[j] * scale),
                            softcap_log2 + alibi);
      else
        dots[j] = sycl::fma(dots[j], scale, alibi);
    }
    if constexpr (MASK_BITS && (FEATURES & FEATURE_MASK_BOOL) != 0)
      AttnMaskPlane::hide_by_bits(dots, attn_mask.key_bits(row, key0));
    else
      attn_mask.apply<FEATURES>(dots, row, key0, 0, 1);
  }

  // The row's part of ALiBi in apply_left_of_diagonal's block from block_key0.
  inline float alibi_row_shift(int64_t row, int64_t block_key0) const {
    return -alibi_log2 * distance(row, block_key0);
  }

  // ALiBi distances are floats from element 0's, taken once in 64 bits: 64-bit integers are
  // emulated on Arc A-series and Meteor Lake GPUs, and per element they made the kernels
  // spill there. Exact while distances stay below 2^24.
  inline float distance(int64_t row, int64_t key) const {
    return static_cast<float>(row + diag - key);
  }

  // The same from element 0's ALiBi distance and the distance step between elements.
  template <int FEATURES, TanhForm TANH = default_tanh(FEATURES), int N>
  inline void apply_from(float (&scores)[N], float (&softcap_grad)[N], float distance0,
                         float step) const {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if constexpr ((FEATURES & FEATURE_SOFTCAP) != 0) {
        if constexpr (TANH == TanhForm::FUSED) {
          const float r = fused_tanh_complement(scores[j]);
          softcap_grad[j] = sycl::fma(-r, r, r);
          scores[j] = sycl::fma(-2.f * softcap_log2, r, softcap_log2);
        } else if constexpr (TANH == TanhForm::SHORT) {
          const float r = tanh_complement(scores[j]);
          softcap_grad[j] = 4.f * r * (1.f - r);
          scores[j] = sycl::fma(-2.f * softcap_log2, r, softcap_log2);  // softcap*log2(e)*tanh
        } else {
          const float t = sycl::tanh(scores[j]);
          softcap_grad[j] = 1.f - t * t;
          scores[j] = softcap_log2 * t;
        }
      }
      if constexpr ((FEATURES & FEATURE_ALIBI) != 0)
        scores[j] -= alibi_log2 * sycl::fabs(distance0 + step * static_cast<float>(j));
    }
  }
};

}  // namespace ipex_flash
