// Decoding: a few new query rows per sequence against a (possibly paged) KV cache. Memory-bound, so
// each K/V element is read once, straight from the cache into registers (no K/V tile in SLM). A
// work-group (one sub-group of DECODE_LANES lanes) per (batch, group of K/V heads, split of the
// keys, slice of rows) serves every query row of its K/V heads (GQA group x new tokens), so the
// heads sharing a K/V element read it once; splits fill the device when sequences are few. Lanes
// run along the head dim in both products (column d = v * LANES + lane): K and V rows are sub-group
// block loads, and every lane is busy however few the rows; transpose_sum adds Q.K^T's per-lane
// partial products across lanes into one (row, key) score per lane, where the softmax runs; P.V
// broadcasts the probabilities from SLM. Each split writes its normalised partial output and LSE,
// which flash_decode_merge_kernel combines (decode/merge_kernel.hpp):
// out = sum_s exp2(lse_s - lse) * out_s, lse = log2 sum_s exp2(lse_s); where registers allow, a
// call of one split writes out and lse itself, one launch fewer (decode/vector_output.hpp). Shape
// and dimension legend: decode/traits.hpp; rows and Q: decode/rows.hpp; reads ahead (GPUs: a
// step's V rows during its scores; the CPU device: every head step by step, DECODE_STEP_MAJOR, a
// burst of reads per step, or for caches of interleaved heads key streams,
// decode/key_streams.hpp) and 16-bit scores on a matrix engine (MATRIX_M > 0): decode/scores.hpp.
// The vector scores, softmax and P.V stay here:
// as functions taking the local memory by reference they made the kernel spill more on DG2,
// Meteor Lake and Arrow Lake-H (gpu-check's record); the output, written once, moved out with
// the same figures.
#pragma once

#include <sycl/sycl.hpp>

#include <algorithm>
#include <cstdint>

#include "common/block_schedule.hpp"
#include "decode/append.hpp"
#include "decode/merge_kernel.hpp"
#include "decode/rows.hpp"
#include "decode/scores.hpp"
#include "decode/key_streams.hpp"
#include "decode/traits.hpp"
#include "decode/vector_output.hpp"
#include "common/kernel_props.hpp"
#include "common/kv_quant.hpp"
#include "score/block_mask.hpp"
#include "common/online_softmax.hpp"
#include "common/params.hpp"
#include "decode/params.hpp"
#include "score/softcap_alibi.hpp"
#include "common/seq_info.hpp"
#include "vector/tile_io.hpp"

namespace ipex_flash {

namespace syclexp = sycl::ext::oneapi::experimental;

template <typename T, int HEAD_DIM, int GROUP_ROWS, int BLOCK_N, int FEATURES, int MATRIX_M,
          int MATRIX_K, int MATRIX_N>
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<DECODE_LANES>))
IPEX_FLASH_REGISTER_FILE
void flash_decode_kernel(DecodeParams p) {
  using Tr = DecodeTraits<T, HEAD_DIM, GROUP_ROWS, BLOCK_N, FEATURES, MATRIX_M, MATRIX_K, MATRIX_N>;
  using KV = typename Tr::KV;
  using Row = typename Tr::Row;
  constexpr int LANES = Tr::LANES, MAX_HEADS = Tr::MAX_HEADS, STEPS = Tr::STEPS;
  constexpr int KEYS_PER_STEP = Tr::KEYS_PER_STEP, HEADS_PER_SET = Tr::HEADS_PER_SET;
  constexpr bool MATRIX = Tr::MATRIX, STEP_MAJOR = Tr::STEP_MAJOR, KEY_STREAMS = Tr::KEY_STREAMS;
  // Q (* prescale) and O of every row the group serves, in vector order (i = vi * LANES + lane,
  // column Row::column(vi, lane)); the running softmax of each head's rows, per lane.
  static syclexp::work_group_static<float[MAX_HEADS][GROUP_ROWS][HEAD_DIM]> q_slm;
  static syclexp::work_group_static<float[MAX_HEADS][GROUP_ROWS][HEAD_DIM]> acc_slm;
  static syclexp::work_group_static<float[MAX_HEADS][LANES]> max_slm;
  static syclexp::work_group_static<float[MAX_HEADS][LANES]> sum_slm;
  // A block's scores, then probabilities: (head, t, r * KEYS_PER_STEP + j).
  static syclexp::work_group_static<float[Tr::PROB_HEADS][STEPS][LANES]> p_slm;
  // Matrix scores only (one element otherwise): Q^T packed per head set (word [d / 2][column],
  // column = head in set * GROUP_ROWS + r), the block's S^T, and a K block staged in SLM when it
  // cannot be read in place (a partial last block, pages that split it, padded head dims).
  static syclexp::work_group_static<uint32_t[Tr::MATRIX_SETS][HEAD_DIM / 2][LANES]> qt_slm;
  static syclexp::work_group_static<float[Tr::MATRIX_KEYS][LANES]> st_slm;
  static syclexp::work_group_static<T[Tr::MATRIX_KEYS][HEAD_DIM]> k_stage_slm;
  // O's factor per lane, as the softmax: one head's at a time, or with key streams every head's.
  static syclexp::work_group_static<float[Tr::FACTOR_HEADS][LANES]> factor_slm;
  float(&q_all)[MAX_HEADS][GROUP_ROWS][HEAD_DIM] = q_slm;
  float(&acc_all)[MAX_HEADS][GROUP_ROWS][HEAD_DIM] = acc_slm;
  float(&row_max)[MAX_HEADS][LANES] = max_slm;
  float(&row_sum)[MAX_HEADS][LANES] = sum_slm;
  float(&probs)[Tr::PROB_HEADS][STEPS][LANES] = p_slm;
  float(&row_factor)[Tr::FACTOR_HEADS][LANES] = factor_slm;
  uint32_t(&q_t)[Tr::MATRIX_SETS][HEAD_DIM / 2][LANES] = qt_slm;
  float(&s_t)[Tr::MATRIX_KEYS][LANES] = st_slm;
  T(&k_stage)[Tr::MATRIX_KEYS][HEAD_DIM] = k_stage_slm;

  const AttentionCommon& c = p.common;
  const auto item = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const auto group = item.get_group();
  const sycl::sub_group sg = item.get_sub_group();
  const int lid = static_cast<int>(item.get_local_id(0));
  const int heads_kv = c.dims.heads_kv();
  const int head_groups = (heads_kv + p.heads_per_group - 1) / p.heads_per_group;
  // Only kernels of a whole sub-group of rows serve slices (more rows than lanes): the others
  // keep their code (and the GPUs' register allocation) as with one slice.
  const int row_slices = GROUP_ROWS == LANES ? p.row_slices : 1;
  const BlockCoord coord = block_coord(static_cast<int64_t>(item.get_group(0)), c.num_blocks,
                                       head_groups * row_slices, /*reverse_blocks=*/false);
  const int b = coord.batch, split = coord.block;
  const int head0 = coord.head / row_slices * p.heads_per_group;
  const int group_heads = std::min(p.heads_per_group, heads_kv - head0);
  const SeqInfo seq = bounded_seq_info(c, p.bounds, b);
  const DecodeHeads<KV> heads{p, seq, b, head0, group_heads};
  const int len_q = seq.len_q;
  // This work-group's slice of each head's heads_per_kv * Nq rows: up to GROUP_ROWS from row0
  // (more rows than lanes take several slices, each reading the keys itself).
  const int row0 = coord.head % row_slices * GROUP_ROWS;
  const DecodeRows rows{p, seq, b, head0, row0, c.dims.heads_per_kv * len_q - row0};
  if (GROUP_ROWS == LANES && rows.count <= 0) return;  // past a shorter sequence's rows
  // Q, K; and V, O unless FEATURE_VALUE_DIM. K and V rows are block loads unless the head dim
  // is padded.
  const int head_dim = c.dims.head_dim;
  const int head_dim_v = (FEATURES & FEATURE_VALUE_DIM) != 0 ? c.dims.head_dim_v : head_dim;
  const bool whole_k = head_dim == HEAD_DIM;
  const DecodeColumns cols{head_dim, head_dim_v, whole_k,
                           (FEATURES & FEATURE_VALUE_DIM) != 0 ? head_dim_v == HEAD_DIM : whole_k};
  // In the softmax this lane holds key my_key of each step for row my_row.
  const int my_row = lid / KEYS_PER_STEP, my_key = lid % KEYS_PER_STEP;
  const bool valid_row = my_row < rows.count;
  const int64_t token = valid_row ? rows.token(my_row) : 0;
  const BlockMask mask = BlockMask::of(c.mask, seq);

  // This split's keys, cut to what any of the rows can see.
  const int64_t split_begin = static_cast<int64_t>(split) * p.split_keys;
  const int64_t kv_first = std::max<int64_t>(split_begin, mask.first_key(0) / BLOCK_N * BLOCK_N);
  // (a page entry outside the pool, which probes/cache_check_kernel.hpp reports: nothing read or
  // appended)
  // (one sub-group: no local memory)
  const bool in_pool = split_pages_in_pool(
      sg, c, p.bounds, b, split_begin, std::min<int64_t>(split_begin + p.split_keys, seq.len_k));
  const int64_t kv_end =
      in_pool ? std::min<int64_t>(split_begin + p.split_keys, mask.end_key(len_q)) : kv_first;
  if constexpr ((FEATURES & FEATURE_APPEND) != 0) {
    // (each new row's page checked by itself, not through in_pool: with the append under the
    // sub-group's verdict the OpenCL CPU compiler's code for the kernel ran 8x slower)
    decode_append<Tr>(p, seq, cols, b, head0, group_heads, split_begin, lid);
    sycl::group_barrier(group);  // the new rows written before any lane reads them
  }

  decode_load_queries<Tr>(group, rows, group_heads, head_dim, lid,
                          DecodeRowState<Tr>{q_all, acc_all, row_max, row_sum, q_t});
  const bool k_in_place = decode_k_in_place<Tr>(c, whole_k);

  uint32_t touched = 0;  // RowVectors::touch
  const DecodeBlocks<Tr> blocks{kv_first, kv_end};
  for (int64_t kv_begin = kv_first; kv_begin < blocks.begins_end();
       kv_begin = blocks.next(kv_begin)) {
    const DecodeKeys keys = blocks.at(kv_begin);
    using HeadRows = DecodeHeadRows<KV>;
    const auto head_rows = [&](int hk) {
      const int h_kv = head0 + hk;
      return HeadRows{kv_rows<KV>(p.k, p.k_stride, c, seq, b, h_kv),
                      kv_rows<KV>(p.v, p.v_stride, c, seq, b, h_kv),
                      kv_descale<FEATURES>(c, b, h_kv).k * Row::UNIT,
                      // per lane: rows span heads
                      ScoreMod::of(c, seq, b, rows.query_head(h_kv, valid_row ? my_row : 0))};
    };
    // A step's raw scores of head hk, one (row, key) per lane, scaled, modified and masked into
    // probs; head-major, the step's V rows read ahead of P.V.
    const auto finish_scores = [&](int hk, const HeadRows& head, int t, float raw_score) {
      float score[1] = {raw_score * head.k_scale};
      if (!STEP_MAJOR && cols.whole_v) touched ^= decode_touch_v<Tr>(sg, head.v, keys, t);
      // (Read through keys, the consecutive order's key made DG2, MTL and ARL-H spill: gpu-check's
      // record.)
      const int64_t key = KEY_STREAMS ? keys.template key<Tr>(t, my_key)
                                      : kv_begin + t * KEYS_PER_STEP + my_key;
      if constexpr (FEATURES != 0) {
        float unused_grad[1];
        head.score_mod.template apply<FEATURES>(score, unused_grad, token, key, 0, 0);
      }
      // The mask, the split's end, padding rows.
      if (!valid_row || key >= kv_end || !mask.visible(token, key)) score[0] = NEG_INF;
      probs[STEP_MAJOR ? hk : 0][t][lid] = score[0];
    };
    // Step t's raw scores of head hk on the vector units.
    const auto vector_scores = [&](int hk, const HeadRows& head, int t) {
      const KvRows<KV>& k = head.k;
      float(&q_rows)[GROUP_ROWS][HEAD_DIM] = q_all[hk];
      // Lanes along d: per-lane partial dot products, summed across lanes by transpose_sum
      // into lane l = (row l / KEYS_PER_STEP, key l % KEYS_PER_STEP). The step loops are left
      // rolled: unrolled, the kernel took twice as long to compile for no speed.
      float partial[LANES] = {};  // (r * KEYS_PER_STEP + j), this lane's columns only
      // On the CPU device Q is read with the lane in the base, so that the compiler sees
      // consecutive lanes read consecutive words (from the row index, the 16-row fp32 kernel
      // gathered them: 6x slower). GPUs keep the form their registers were checked with.
      const DecodeStepRows<Tr> step{k, keys, t};
      for (int vi = 0; vi < Tr::D_VECS; vi += Tr::PER_LOAD) {
#pragma unroll
        for (int j = 0; j < KEYS_PER_STEP; ++j) {
          float k_vec[Tr::PER_LOAD];  // (vi + u)
          Row::load(sg, step.row(j), vi, cols.whole_k, cols.head_dim, lid, k_vec);
#pragma unroll
          for (int u = 0; u < Tr::PER_LOAD; ++u)
#pragma unroll
            for (int r = 0; r < GROUP_ROWS; ++r)
#if defined(IPEX_FLASH_CPU_LOOPS)
              partial[r * KEYS_PER_STEP + j] +=
                  (&q_rows[0][lid])[r * HEAD_DIM + (vi + u) * LANES] * k_vec[u];
#else
              partial[r * KEYS_PER_STEP + j] += q_rows[r][(vi + u) * LANES + lid] * k_vec[u];
#endif
        }
      }
      finish_scores(hk, head, t, transpose_sum<LANES>(sg, partial, lid));
    };
    const auto matrix_scores = [&](int hk, const HeadRows& head) {
      decode_matrix_scores<Tr>(group, sg, head.k, keys, k_in_place,
                               &q_t[hk / HEADS_PER_SET][0][0], s_t, k_stage, head_dim, lid);
      const int column0 = (hk % HEADS_PER_SET) * GROUP_ROWS;  // this head's columns
      for (int t = 0; t < STEPS; ++t)
        finish_scores(hk, head, t,
                      c.q_prescale * s_t[t * KEYS_PER_STEP + my_key][column0 + my_row]);
    };
    // The block's online softmax of head hk, its scores in probs made probabilities; O's
    // rescale into row_factor (row hk with key streams).
    const auto block_softmax = [&](int hk) {
      float(&head_probs)[STEPS][LANES] = probs[STEP_MAJOR ? hk : 0];
      // Online softmax over the row's lanes.
      float block_max = NEG_INF;
      for (int t = 0; t < STEPS; ++t) block_max = sycl::fmax(block_max, head_probs[t][lid]);
      OnlineSoftmaxRow softmax{row_max[hk][lid], row_sum[hk][lid]};
      row_factor[KEY_STREAMS ? hk : 0][lid] =
          softmax.raise_max(lane_group_max<KEYS_PER_STEP>(sg, block_max));
      float block_sum = 0.f;
      for (int t = 0; t < STEPS; ++t) {
        const float prob = softmax.probability(head_probs[t][lid]);
        head_probs[t][lid] = prob;
        block_sum += prob;
      }
      softmax.row_sum += lane_group_sum<KEYS_PER_STEP>(sg, block_sum);
      row_max[hk][lid] = softmax.row_max;
      row_sum[hk][lid] = softmax.row_sum;
    };
    // The block's online softmax and P.V of head hk.
    const auto softmax_and_pv = [&](int hk, const KvRows<KV> v) {
      float(&acc)[GROUP_ROWS][HEAD_DIM] = acc_all[hk];
      float(&head_probs)[STEPS][LANES] = probs[STEP_MAJOR ? hk : 0];
      block_softmax(hk);
      sycl::group_barrier(group);

      // P.V: lanes along d again; probabilities broadcast from SLM, V rows block-loaded.
      for (int v0 = 0; v0 < Tr::D_VECS; v0 += Tr::PV_VECS) {
        float sum[Tr::PV_VECS][GROUP_ROWS];  // (v, r)
#pragma unroll
        for (int u = 0; u < Tr::PV_VECS; ++u)
#pragma unroll
          for (int r = 0; r < GROUP_ROWS; ++r)
            sum[u][r] = acc[r][(v0 + u) * LANES + lid] * row_factor[0][r * KEYS_PER_STEP];
        // (a page lookup per run of keys: DecodeStepRows)
        for (int run = 0; run < keys.count; run += DECODE_KEY_RUN) {
          const KV* row = v.row(kv_begin + run);
          for (int key = run; key < std::min(run + DECODE_KEY_RUN, keys.count);
               ++key, row += v.row_stride)
            decode_pv_key<Tr, Tr::PV_VECS>(sg, row, v0,
                                           &head_probs[key / KEYS_PER_STEP][key % KEYS_PER_STEP],
                                           cols, lid, sum);
        }
#pragma unroll
        for (int u = 0; u < Tr::PV_VECS; ++u)
#pragma unroll
          for (int r = 0; r < GROUP_ROWS; ++r) acc[r][(v0 + u) * LANES + lid] = sum[u][r];
      }
      sycl::group_barrier(group);  // before the next head overwrites row_factor (and s_t)
    };

    if constexpr (STEP_MAJOR) {
      for (int t = 0; t < STEPS; ++t) {  // key streams need no burst: prefetchers follow them
        if (!KEY_STREAMS && cols.whole_k && cols.whole_v)
          touched ^= decode_touch_step<Tr>(sg, heads, keys, t);
        for (int hk = 0; hk < group_heads; ++hk) vector_scores(hk, head_rows(hk), t);
      }
      if constexpr (KEY_STREAMS) {
        for (int hk = 0; hk < group_heads; ++hk) block_softmax(hk);
        sycl::group_barrier(group);
        for (int t = 0; t < STEPS; ++t)
          decode_stream_pv<Tr>(sg, heads, keys, t, acc_all, probs, row_factor, cols, lid);
        sycl::group_barrier(group);  // before the next block's scores overwrite probs
      } else {
        for (int hk = 0; hk < group_heads; ++hk) softmax_and_pv(hk, heads.v(hk));
      }
    } else {
      for (int hk = 0; hk < group_heads; ++hk) {
        const HeadRows head = head_rows(hk);
        if constexpr (MATRIX) {
          matrix_scores(hk, head);
        } else {
          // (rolled: with the reads as sub-group block loads IGC unrolled it, issued a whole
          // block's K reads at once and spilled on the 128-register GPUs)
#pragma unroll 1
          for (int t = 0; t < STEPS; ++t) vector_scores(hk, head, t);
        }
        softmax_and_pv(hk, head.v);
      }
    }
  }
  // Never true (heads_per_group >= 1), but the compiler cannot know: keeps the reads of
  // RowVectors::touch from being dropped as dead.
  if (p.heads_per_group < 0) p.partial_lse[lid] = static_cast<float>(touched);
  decode_vector_write<Tr>(group, rows, DecodeRowState<Tr>{q_all, acc_all, row_max, row_sum, q_t},
                          row_factor, group_heads, split, head_dim_v, lid);
}

}  // namespace ipex_flash
