// LaunchPlan's checks of a call's values: a KV cache's lengths, pages and starts, and packed
// sequences' offsets, read on the host where the device shares its memory, or left to a
// kernel after the attention (check_on_device, cache_check.hpp) where it does not.
#include <algorithm>

#include "host/launch/cache_check_launch.hpp"
#include "host/plans/launch_plan.hpp"
#include "device/probes/params.hpp"

namespace ipex_flash {

int64_t LaunchPlan::cache_capacity() const {
  const int64_t capacity = cache_bounds(k_, options_).key_capacity;
  return limits_.max_keys >= 0 ? std::min(capacity, limits_.max_keys) : capacity;
}

int64_t LaunchPlan::rotated_positions() const {
  // With rotary, the last position a table row is read for (keys, or queries that advance).
  if (!rotary_rows_) return 0;
  return std::max<int64_t>(append_->new_tokens,
                           append_->rotary.q_positions_advance ? q_.sizes[2] : 1);
}

bool LaunchPlan::cache_values_fit(const PlanAddresses& at, int64_t& max_len_k) const {
  const int64_t batch = q_.sizes[0];
  const auto* keys = reinterpret_cast<const int32_t*>(at.seqlens_k);
  const auto* starts = reinterpret_cast<const int32_t*>(at.k_start);
  const int64_t appended = append_ ? append_->new_tokens : 0;
  if (options_.block_table) {
    // The pages each sequence reads; entries past them may hold anything (cache_check.hpp).
    const TensorView& table = *options_.block_table;
    const auto* pages = reinterpret_cast<const int32_t*>(at.block_table);
    const int32_t pool = cache_bounds(k_, options_).pages;
    for (int64_t b = 0; b < table.sizes[0]; ++b)
      for (int64_t column = 0; column < table.sizes[1] &&
                               column * options_.page_size < keys[b] + appended; ++column)
        if (!page_in_pool(pages[b * table.strides[0] + column], pool)) return false;
  }
  const int64_t capacity = cache_capacity();
  const int64_t rotated = rotated_positions();
  max_len_k = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = starts ? starts[b] : 0, after = keys[b] + appended;
    if (!keys_fit_cache(keys[b], appended, capacity) || !start_within_keys(start, keys[b]) ||
        after - start < limits_.min_keys || (rotary_rows_ && keys[b] + rotated > rotary_rows_))
      return false;
    max_len_k = std::max<int64_t>(max_len_k, after - start);
  }
  return true;
}

bool uniform_offsets(const int32_t* cu_seqlens, int64_t batch, int64_t length) {
  for (int64_t b = 0; b <= batch; ++b)
    if (cu_seqlens[b] != b * length) return false;
  return true;
}

// Packed offsets of `batch` sequences (host memory): from 0, never decreasing, ending at most
// at `total`, no sequence longer than `longest`.
bool offsets_within(std::uintptr_t address, int64_t batch, int64_t total, int64_t longest) {
  const auto* cu = reinterpret_cast<const int32_t*>(address);
  if (cu[0] != 0 || cu[batch] > total) return false;
  for (int64_t b = 0; b < batch; ++b)
    if (cu[b + 1] < cu[b] || static_cast<int64_t>(cu[b + 1]) - cu[b] > longest) return false;
  return true;
}

bool LaunchPlan::offsets_fit(const PlanAddresses& at) const {
  const int64_t batch = options_.cu_seqlens_q->sizes[0] - 1;
  return offsets_within(at.cu_seqlens_q, batch, q_.sizes[2], options_.max_seqlen_q) &&
         (!options_.cu_seqlens_k ||
          offsets_within(at.cu_seqlens_k, batch, k_.sizes[2], options_.max_seqlen_k));
}

CacheCheckParams LaunchPlan::cache_check_params(const PlanAddresses& at) const {
  const std::optional<TensorView>& table = options_.block_table;
  CacheCheckParams params{};
  params.seqlens = reinterpret_cast<const int32_t*>(at.seqlens_k);
  params.k_start = reinterpret_cast<const int32_t*>(at.k_start);
  params.block_table = reinterpret_cast<const int32_t*>(at.block_table);
  params.table_stride = table ? table->strides[0] : 0;
  params.page_size = static_cast<int32_t>(options_.page_size);
  params.batch = static_cast<int32_t>(q_.sizes[0]);
  params.table_width = table ? static_cast<int32_t>(table->sizes[1]) : 0;
  params.pages = cache_bounds(k_, options_).pages;
  params.capacity = static_cast<int32_t>(cache_capacity());
  params.appended = append_ ? append_->new_tokens : 0;
  params.rotated = static_cast<int32_t>(rotated_positions());
  params.rotary_rows = static_cast<int32_t>(rotary_rows_);
  params.min_keys = static_cast<int32_t>(limits_.min_keys);
  if (uniform_queries_) {
    params.cu_seqlens_q = reinterpret_cast<const int32_t*>(at.cu_seqlens_q);
    params.queries = static_cast<int32_t>(q_.sizes[2]);
  }
  return params;
}

void LaunchPlan::check_on_device(const PlanAddresses& at, std::uintptr_t queue_handle) const {
  CacheCheckParams params = cache_check_params(at);
  params.out = nan_fill_view(out_, at.out);
  params.lse = nan_fill_view(lse_, at.lse);  // (0: the caller has no LSE)
  params.errors = kSeqlensOutOfRange | kLeftpadOutOfRange | kPageOutOfRange | kRotaryTooShort;
  if (uniform_queries_) {  // (one query per sequence: other offsets break max_seqlen_q = 1)
    params.errors |= kQueriesNotUniform;
    params.caller = kFoundByServingCall;
  }
  check_cache_values(params, queue_handle);
}

}  // namespace ipex_flash
