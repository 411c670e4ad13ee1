// A launch plan: everything one signature of forward call needs (the views' shapes and
// strides, the options, the kernel: split-KV decode or general), checked and chosen once on a
// first call, then run by repeated calls of the same signature with new data addresses. The
// Python entry points keep plans per signature (ipex_flash/ops/launch_plans.py); what a call
// costs on the host is then a lookup and this one crossing, for CPU tensors and for XPU
// streams alike.
#pragma once

#include <cstdint>
#include <mutex>

#include <optional>
#include <string>

#include "host/launch/attention_options.hpp"
#include "host/launch/tensor_view.hpp"
#include "device/common/params.hpp"
#include "device/kvcache/params.hpp"
#include "device/probes/params.hpp"

namespace ipex_flash {

// The data addresses of one call. 0 for a tensor the plan was built without, and for an LSE
// the caller has no use for (the plan then keeps it in scratch).
struct PlanAddresses {
  std::uintptr_t q = 0, k = 0, v = 0, out = 0, lse = 0;
  std::uintptr_t alibi_slopes = 0, sinks = 0, k_descale = 0, v_descale = 0;
  std::uintptr_t seqlens_k = 0, block_table = 0, k_start = 0;
  std::uintptr_t k_new = 0, v_new = 0;  // keys and values appended to the cache first
  std::uintptr_t rotary_cos = 0, rotary_sin = 0;  // with rotary: the tables
  std::uintptr_t attn_mask = 0;
  std::uintptr_t cu_seqlens_q = 0, cu_seqlens_k = 0;  // packed sequences (flash-attn's varlen)
};

// What a plan's calls may ask of the kernels, and the bounds of a KV cache's values.
struct PlanLimits {
  int num_splits = 0;     // splits of the keys in the decode kernel, as run_forward's (0 chooses)
  int64_t min_keys = 0;   // keys every sequence of a cache must attend to, at least
  int64_t max_keys = -1;  // and at most (-1: the cache's capacity)
};

class LaunchPlan {
 public:
  // q, k, v, out (B, H, N, D) views and lse (B, Hq, Nq), as flash_decode and flash_fwd take
  // them; options as those launches take them (a KV cache: seqlens_k, maybe pages and
  // k_start). The views' addresses are those of the call that builds the plan: they are
  // replaced on each run. limits: see PlanLimits.
  LaunchPlan(TensorView q, TensorView k, TensorView v, TensorView out, TensorView lse,
             AttentionOptions options, PlanLimits limits, std::uintptr_t queue_handle);

  // Each run first appends new keys and values (B, Hkv, Nnew, D) views, in the cache's dtype
  // (or 16-bit ones into an FP8 cache, quantised by its descales), at positions seqlens_k[b] +
  // i (flash_attn_with_kvcache's k, v): the attention then reads seqlens_k + Nnew keys. The
  // decode kernel does it in the same launch where it can (appends_in_decode).
  void append(TensorView k_new, TensorView v_new);

  // And rotates the new keys and the queries first (after append): cos, sin (seqlen_ro,
  // rotary_dim / 2) views; q_positions_advance: query i at seqlens_k[b] + i, else all at
  // seqlens_k[b]. The plan's q must be dense (B, Nq, Hq, D) memory: the rotated queries are
  // written to scratch in that layout.
  void rotary(TensorView cos, TensorView sin, bool interleaved, bool q_positions_advance);

  // Runs packed sequences (flash_attn_varlen_func) of the plan's Nq queries each, whose keys
  // the plan reads as a cache: sequence b's are rows cu_seqlens_k[b]..cu_seqlens_k[b + 1] of k,
  // seen with batch stride 0 (ops/varlen_decode.py). Each run takes seqlens_k and k_start
  // from cu_seqlens_k, and checks (on the CPU device) that cu_seqlens_q is 0, Nq, 2 Nq, ...
  // and that no sequence has more than max_seqlen_k keys.
  void packed_sequences(int64_t max_seqlen_k);

  // Checks on each run (on the CPU device; the caller checks elsewhere) that cu_seqlens_q is
  // 0, Nq, 2 Nq, ...: the serving call's decode steps, whose queries the plan reads as
  // (B, Nq) rows.
  void uniform_queries() { uniform_queries_ = true; }
  int64_t packed_queries() const { return packed_max_keys_ >= 0 ? q_.sizes[2] : 0; }

  // Runs the call at these addresses on this queue (one of the device the plan was made
  // for: the current stream's may change between calls). max_len_k: the most keys a sequence
  // of a KV cache attends to, or -1 to read it (with the checks below) from seqlens_k where
  // the device shares host memory (the CPU device). Returns false, with nothing launched,
  // when the cache's values read so are out of range (keys beyond the capacity, pages outside
  // the cache) or packed sequences' offsets are not (cu_seqlens_q, cu_seqlens_k: from 0, never
  // decreasing, no sequence longer than max_seqlen_q / max_seqlen_k, ending within q and k;
  // read on the CPU device, checked by the caller on others): the caller's general path then
  // names the argument.
  // max_keys: the call's own bound of each sequence's keys (a serving call's max_seqlen_k,
  // which changes every step) for this run and the next, or kPlanBound to keep the plan's, so
  // that a per-step value need not be part of the plan's signature.
  static constexpr int64_t kPlanBound = -2;
  bool run(const PlanAddresses& at, int64_t max_len_k, std::uintptr_t queue_handle,
           int64_t max_keys = kPlanBound);
  // max_len_k for a run that reads no value on the host (checks_on_device): the grid covers
  // the cache's capacity, the kernels bound each sequence by its own length, and a kernel run
  // after them checks the values (cache_check.hpp). The run first raises what the previous
  // check on the device found; what this one finds, the next run raises.
  static constexpr int64_t kCheckOnDevice = -2;
  // max_len_k for a run that reads the values with one kernel on the device and waits for it
  // (cache_check.hpp), then goes on as a host read would: a device that does not share host
  // memory, where the run must know before launching (the serving call's decode steps,
  // IPEX_FLASH_SYNC_CACHE_CHECKS).
  static constexpr int64_t kReadOnDevice = -3;
  // Whether runs may take kCheckOnDevice: a flash_attn_with_kvcache decode step, whose only
  // values are the cache's (not packed sequences' offsets, not an append by a separate kernel,
  // which would write first), or a serving call's step of one query per sequence, where any
  // cu_seqlens_q but 0, 1, ..., B and any seqused_k past max_seqlen_k break the call's own
  // bounds (errors, not a step for the general path). A serving step of more query tokens
  // keeps a read: uneven tokens, or fewer keys than tokens, are valid steps the general path
  // serves.
  bool checks_on_device() const {
    if (!decode_ || packed_max_keys_ >= 0 || limits_.min_keys != 0) return false;
    if (uniform_queries_) return q_.sizes[2] == 1 && !append_;
    return (!append_ || options_.k_new) && limits_.max_keys < 0;
  }

  bool uses_decode_kernel() const { return decode_; }
  // Whether the decode kernel appends the new keys and values itself (one launch a run).
  bool appends_in_decode() const { return options_.k_new.has_value(); }

 private:
  bool cache_values_fit(const PlanAddresses& at, int64_t& max_len_k) const;
  int64_t cache_capacity() const;
  int64_t rotated_positions() const;
  CacheCheckParams cache_check_params(const PlanAddresses& at) const;
  void check_on_device(const PlanAddresses& at, std::uintptr_t queue_handle) const;
  bool offsets_fit(const PlanAddresses& at) const;
  void launch(int64_t max_len_k, std::uintptr_t queue_handle);
  int64_t lse_scratch_bytes() const;

  TensorView q_, k_, v_, out_, lse_;
  AttentionOptions options_;
  PlanLimits limits_;
  std::optional<KvAppendParams> append_;  // with its addresses filled in by each run
  std::string append_dtype_;              // the appended tokens' (16-bit into FP8: quantised)
  std::string cos_dtype_;                 // with rotary
  int64_t rotary_rows_ = 0;               // positions the tables hold
  int64_t packed_max_keys_ = -1;          // with packed_sequences: max_seqlen_k
  bool uniform_queries_ = false;
  bool decode_;
  bool host_readable_;  // the device reads host memory: the CPU device
  std::mutex mutex_;    // run fills the views in place: one call of a plan at a time
};

// Whether each of `batch` packed sequences has `length` rows: cu_seqlens (batch + 1 int32, host
// memory) is 0, length, 2 * length, ...
bool uniform_offsets(const int32_t* cu_seqlens, int64_t batch, int64_t length);

// Whether packed offsets of `batch` sequences (host memory) start from 0, never decrease, end
// at most at `total`, and give no sequence more than `longest` rows.
bool offsets_within(std::uintptr_t address, int64_t batch, int64_t total, int64_t longest);

// Scratch memory on a queue's device, reused by the calling thread's later launches on the
// same queue (in order, so a launch never overwrites scratch an earlier one still reads).
void* queue_scratch(std::uintptr_t queue_handle, size_t bytes);

}  // namespace ipex_flash
