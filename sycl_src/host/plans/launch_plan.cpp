#include "host/plans/launch_plan.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "host/launch/attention_options.hpp"
#include "host/launch/cache_check_launch.hpp"
#include "host/launch/decode_launch.hpp"
#include "host/launch/forward_launch.hpp"
#include "host/launch/kv_append_launch.hpp"
#include "host/launch/submit.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/variants/decode_or_general.hpp"
#include "device/kvcache/params.hpp"

namespace ipex_flash {

namespace {

constexpr int64_t kScratchAlign = 256;  // bytes: each part of the scratch block starts so

int64_t round_up(int64_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

struct ScratchBlock {
  void* data = nullptr;
  size_t bytes = 0;
};

void set_address(std::optional<TensorView>& view, std::uintptr_t address) {
  if (view) view->data = address;
}

}  // namespace

void* queue_scratch(std::uintptr_t queue_handle, size_t bytes) {
  // Per thread: two Python threads may launch at once (the launches release the GIL). Never
  // freed at thread exit: the SYCL runtime may be torn down before thread-local destructors.
  thread_local std::unordered_map<std::uintptr_t, ScratchBlock> blocks;
  sycl::queue& queue = queue_from_handle(queue_handle);
  ScratchBlock& block = blocks[reinterpret_cast<std::uintptr_t>(&queue)];
  if (block.bytes < bytes) {
    if (block.data) {
      queue.wait();  // the thread's earlier launches on this queue may still read it
      sycl::free(block.data, queue);
    }
    block.bytes = std::max(bytes, 2 * block.bytes);
    block.data = sycl::malloc_device(block.bytes, queue);
    if (!block.data) {
      block.bytes = 0;
      throw std::runtime_error("ipex_flash: out of device memory for " +
                               std::to_string(bytes) + " bytes of scratch");
    }
  }
  return block.data;
}

LaunchPlan::LaunchPlan(TensorView q, TensorView k, TensorView v, TensorView out, TensorView lse,
                       AttentionOptions options, PlanLimits limits, std::uintptr_t queue_handle)
    : q_(std::move(q)), k_(std::move(k)), v_(std::move(v)), out_(std::move(out)),
      lse_(std::move(lse)), options_(std::move(options)), limits_(limits) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  host_readable_ = queue.get_device().is_cpu();
  decode_ = takes_decode_kernel(q_, k_, v_, options_, /*backward_follows=*/false, queue_handle);
  make_common(q_, k_, v_, lse_, options_);  // the launches' own checks, once
}

void LaunchPlan::append(TensorView k_new, TensorView v_new) {
  // 16-bit tokens into an FP8 cache are quantised by its descales.
  const bool quantised = kv_feature(k_.dtype) != 0 && options_.k_descale &&
                         (k_new.dtype == "float16" || k_new.dtype == "bfloat16");
  if (!options_.seqlens_k || (k_new.dtype != k_.dtype && !quantised) ||
      v_new.dtype != k_new.dtype || v_.dtype != k_.dtype ||
      k_new.sizes != std::vector<int64_t>{q_.sizes[0], k_.sizes[1], k_new.sizes[2], k_.sizes[3]} ||
      v_new.sizes != std::vector<int64_t>{q_.sizes[0], k_.sizes[1], k_new.sizes[2], v_.sizes[3]})
    throw std::invalid_argument("ipex_flash: the appended k, v must be (B, Hkv, Nnew, D) views "
                                "in the cache's dtype (or 16-bit into an FP8 cache with its "
                                "descales), with a cache of known lengths");
  KvAppendParams a{};
  a.k_new_stride = bhnd_strides(k_new, "k");
  a.v_new_stride = bhnd_strides(v_new, "v");
  a.k_cache_stride = bhnd_strides(k_, "k_cache");
  a.v_cache_stride = bhnd_strides(v_, "v_cache");
  a.table_stride = options_.block_table ? options_.block_table->strides[0] : 0;
  a.batch = static_cast<int32_t>(q_.sizes[0]);
  a.new_tokens = static_cast<int32_t>(k_new.sizes[2]);
  a.heads = static_cast<int32_t>(k_.sizes[1]);
  a.head_dim = static_cast<int32_t>(k_.sizes[3]);
  a.head_dim_v = static_cast<int32_t>(v_.sizes[3]);
  a.page_size = options_.page_size;
  append_ = a;
  append_dtype_ = k_new.dtype;
  // The decode kernel appends them itself where one work-group reads each new row
  // (decode/append.hpp), rotary (below) included.
  const int64_t rows = q_.sizes[1] / std::max<int64_t>(k_.sizes[1], 1) * q_.sizes[2];
  if (decode_ && decode_row_slices(static_cast<int>(rows)) == 1 && k_new.dtype == q_.dtype) {
    options_.k_new = std::move(k_new);
    options_.v_new = std::move(v_new);
  }
}

namespace {

// Whether a (B, H, N, D) view is (B, N, H, D) memory, dense; a dimension of size 1 may have
// any stride (torch's contiguous() leaves it as it was).
bool dense_bnhd(const TensorView& t) {
  const int64_t d = t.sizes[3], row = t.sizes[1] * d;
  const int64_t dense[4] = {row * t.sizes[2], d, row, 1};
  for (int dim = 0; dim < 4; ++dim)
    if (t.sizes[dim] > 1 && t.strides[dim] != dense[dim]) return false;
  return true;
}

}  // namespace

void LaunchPlan::rotary(TensorView cos, TensorView sin, bool interleaved,
                        bool q_positions_advance) {
  if (!append_ || cos.sizes != sin.sizes || cos.strides != sin.strides || cos.dtype != sin.dtype ||
      cos.sizes.size() != 2 || cos.strides[1] != 1 || 2 * cos.sizes[1] > q_.sizes[3] ||
      (cos.dtype != "float32" && cos.dtype != q_.dtype) || !dense_bnhd(q_) ||
      (kv_feature(k_.dtype) != 0 && !options_.k_new))
    throw std::invalid_argument("ipex_flash: rotary needs an append (by the decode kernel into "
                                "an FP8 cache), dense (B, Nq, Hq, D) queries and (seqlen_ro, "
                                "rotary_dim / 2) tables in float32 or q's dtype");
  append_->q_stride = append_->q_rotated_stride = bhnd_strides(q_, "q");
  append_->rotary = RotaryParams{nullptr, nullptr, cos.strides[0],
                                 static_cast<int32_t>(2 * cos.sizes[1]), interleaved,
                                 q_positions_advance, static_cast<int32_t>(cos.sizes[0])};
  append_->heads_q = static_cast<int32_t>(q_.sizes[1]);
  append_->len_q = static_cast<int32_t>(q_.sizes[2]);
  cos_dtype_ = cos.dtype;
  rotary_rows_ = cos.sizes[0];
  if (options_.k_new) {  // the decode kernel appends: it rotates the keys and queries too
    options_.rotary_cos = std::move(cos);
    options_.rotary_sin = std::move(sin);
    options_.rotary_interleaved = interleaved;
    options_.rotary_q_positions_advance = q_positions_advance;
  }
}

void LaunchPlan::packed_sequences(int64_t max_seqlen_k) {
  if (!options_.seqlens_k || !options_.k_start || options_.block_table || append_ ||
      (q_.sizes[0] > 1 && (k_.strides[0] != 0 || v_.strides[0] != 0)))
    throw std::invalid_argument("ipex_flash: packed sequences need a cache of known lengths and "
                                "starts, unpaged, seen with batch stride 0");
  packed_max_keys_ = max_seqlen_k;
  uniform_queries_ = true;
}

bool LaunchPlan::run(const PlanAddresses& given, int64_t max_len_k, std::uintptr_t queue_handle,
                     int64_t max_keys) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (max_keys != kPlanBound) limits_.max_keys = max_keys;
  PlanAddresses at = given;
  const bool host_reads = host_readable_ && max_len_k == -1;  // (else the caller or the device)
  if (uniform_queries_ && host_reads &&
      !uniform_offsets(reinterpret_cast<const int32_t*>(at.cu_seqlens_q), q_.sizes[0],
                       q_.sizes[2]))
    return false;
  if (packed_max_keys_ >= 0) {
    if (host_reads &&
        !offsets_within(at.cu_seqlens_k, q_.sizes[0], k_.sizes[2], packed_max_keys_))
      return false;
    at.seqlens_k = at.cu_seqlens_k + sizeof(int32_t);
    at.k_start = at.cu_seqlens_k;
  }
  q_.data = at.q, k_.data = at.k, v_.data = at.v, out_.data = at.out, lse_.data = at.lse;
  set_address(options_.alibi_slopes, at.alibi_slopes);
  set_address(options_.sinks, at.sinks);
  set_address(options_.k_descale, at.k_descale);
  set_address(options_.v_descale, at.v_descale);
  set_address(options_.seqlens_k, at.seqlens_k);
  set_address(options_.block_table, at.block_table);
  set_address(options_.k_start, at.k_start);
  set_address(options_.attn_mask, at.attn_mask);
  set_address(options_.cu_seqlens_q, at.cu_seqlens_q);
  set_address(options_.cu_seqlens_k, at.cu_seqlens_k);
  set_address(options_.k_new, at.k_new);
  set_address(options_.v_new, at.v_new);
  set_address(options_.rotary_cos, at.rotary_cos);
  set_address(options_.rotary_sin, at.rotary_sin);
  if (options_.cu_seqlens_q && host_reads && !offsets_fit(at)) return false;
  // MLA's one latent cache as k_cache and a view of it as v_cache: an append would write the
  // shared columns twice, so such calls go to the general path, which refuses them
  // (ipex_flash/kvcache/cache_ops.py, check_appendable).
  if (append_ && rows_overlap(k_, v_)) return false;
  if (append_) {
    append_->k_new = reinterpret_cast<const void*>(at.k_new);
    append_->v_new = reinterpret_cast<const void*>(at.v_new);
    append_->k_cache = reinterpret_cast<void*>(at.k);
    append_->v_cache = reinterpret_cast<void*>(at.v);
    append_->seqlens = reinterpret_cast<const int32_t*>(at.seqlens_k);
    append_->block_table = reinterpret_cast<const int32_t*>(at.block_table);
    append_->q = reinterpret_cast<const void*>(at.q);
    append_->rotary.cos = reinterpret_cast<const void*>(at.rotary_cos);
    append_->rotary.sin = reinterpret_cast<const void*>(at.rotary_sin);
    append_->k_descale = reinterpret_cast<const float*>(at.k_descale);
    append_->v_descale = reinterpret_cast<const float*>(at.v_descale);
  }
  const bool device_checks = max_len_k == kCheckOnDevice;
  if (device_checks) {
    if (!checks_on_device() || !options_.seqlens_k) return false;
    raise_cache_check_errors(queue_handle);
    max_len_k = cache_capacity();
  } else if (max_len_k == kReadOnDevice) {
    if (!options_.seqlens_k) return false;
    const CacheValues read = read_cache_values(cache_check_params(at), queue_handle);
    if (read.bits != 0) return false;
    max_len_k = read.most_keys;
  }
  if (!options_.seqlens_k) {
    max_len_k = k_.sizes[2];
  } else if (max_len_k < 0) {
    if (!host_reads || !cache_values_fit(at, max_len_k)) return false;
  }
  if (max_len_k == 0) return false;  // no key: the general path fills the rows
  if (options_.seqlens_k) options_.max_seqlen_k = static_cast<int32_t>(max_len_k);
  launch(max_len_k, queue_handle);
  if (device_checks) check_on_device(at, queue_handle);
  return true;
}

int64_t LaunchPlan::lse_scratch_bytes() const {
  if (lse_.data != 0) return 0;
  int64_t last = 0;  // the view's furthest element
  for (size_t d = 0; d < lse_.sizes.size(); ++d) last += (lse_.sizes[d] - 1) * lse_.strides[d];
  return round_up(sizeof(float) * (last + 1));
}

void LaunchPlan::launch(int64_t max_len_k, std::uintptr_t queue_handle) {
  // The scratch block holds the LSE when the caller has no use for it (address 0), then the
  // kernel's own scratch.
  const int64_t lse_bytes = lse_scratch_bytes();
  const bool append_kernel = append_ && !options_.k_new;  // else the decode kernel appends
  const int64_t lengths_bytes = append_kernel ? round_up(sizeof(int32_t) * q_.sizes[0]) : 0;
  const int64_t rotated_q_bytes =
      rotary_rows_ && append_kernel  // dense (dense_bnhd): read and written with q's strides
          ? round_up((q_.dtype == "float32" ? 4 : 2) * q_.sizes[0] * q_.sizes[1] * q_.sizes[2] *
                     q_.sizes[3])
          : 0;
  const int64_t before = lse_bytes + lengths_bytes + rotated_q_bytes;
  const auto scratch_for = [&](int64_t bytes) {
    auto* block = static_cast<char*>(queue_scratch(queue_handle, before + bytes));
    if (lse_bytes) lse_.data = reinterpret_cast<std::uintptr_t>(block);
    if (append_kernel) {  // the attention reads the lengths after the append, which writes them
      append_->seqlens_after = reinterpret_cast<int32_t*>(block + lse_bytes);
      if (rotary_rows_) {  // and the rotated queries
        append_->q_rotated = block + lse_bytes + lengths_bytes;
        q_.data = reinterpret_cast<std::uintptr_t>(append_->q_rotated);
      }
      kv_append(*append_, k_.dtype, append_dtype_, cos_dtype_, queue_handle);
      options_.seqlens_k->data = reinterpret_cast<std::uintptr_t>(append_->seqlens_after);
    }
    return block + before;
  };
  if (!decode_) {
    const int64_t bytes = fwd_scratch_bytes(q_, k_, v_, options_, queue_handle);
    const auto scratch = reinterpret_cast<std::uintptr_t>(
        bytes || lse_bytes || append_kernel ? scratch_for(bytes) : nullptr);
    flash_fwd(q_, k_, v_, out_, lse_, TensorView{scratch, "uint8", {bytes}, {1}}, options_,
              queue_handle);
    return;
  }
  const int64_t batch = q_.sizes[0], heads_q = q_.sizes[1], len_q = q_.sizes[2];
  const int64_t heads_kv = k_.sizes[1], head_dim_v = v_.sizes[3];
  const int64_t splits = decode_splits(
      limits_.num_splits, static_cast<int>(batch), static_cast<int>(heads_kv),
      static_cast<int>(len_q * (heads_q / heads_kv)),
      static_cast<int>(std::max(q_.sizes[3], head_dim_v)), max_len_k, queue_handle);
  const int64_t partial_rows = batch * heads_q * len_q * splits;
  // After the partial results, a bool mask's bits where the kernel reads them.
  const int64_t partial_bytes = round_up(sizeof(float) * partial_rows * (head_dim_v + 1));
  const int64_t bits_bytes =
      options_.attn_mask ? decode_scratch_bytes(q_, k_, v_, options_, queue_handle) : 0;
  auto* scratch = reinterpret_cast<float*>(scratch_for(partial_bytes + bits_bytes));
  const auto address = [](float* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const TensorView bits{address(scratch) + partial_bytes, "uint8", {bits_bytes}, {1}};
  const TensorView partial_out{
      address(scratch), "float32", {batch, heads_q, len_q, splits, head_dim_v},
      {heads_q * len_q * splits * head_dim_v, len_q * splits * head_dim_v, splits * head_dim_v,
       head_dim_v, 1}};
  const TensorView partial_lse{address(scratch + partial_rows * head_dim_v), "float32",
                               {batch, heads_q, len_q, splits},
                               {heads_q * len_q * splits, len_q * splits, splits, 1}};
  flash_decode(q_, k_, v_, out_, lse_, partial_out, partial_lse, options_, queue_handle, bits);
}

}  // namespace ipex_flash
