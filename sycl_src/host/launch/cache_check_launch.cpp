#include "host/launch/cache_check_launch.hpp"

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "host/launch/attention_options.hpp"
#include "host/launch/submit.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/variants/device_limits.hpp"
#include "device/probes/params.hpp"

namespace ipex_flash {

namespace {

// One word of host memory per context, written by the check kernel and read by the host
// without waiting for the device. Never freed: the SYCL runtime may be torn down first.
uint32_t* error_word(sycl::queue& queue) {
  static std::mutex mutex;
  static std::unordered_map<sycl::context, uint32_t*> words;
  const std::lock_guard<std::mutex> lock(mutex);
  uint32_t*& word = words[queue.get_context()];
  if (word == nullptr) {
    word = sycl::malloc_host<uint32_t>(1, queue);
    if (word == nullptr) throw std::runtime_error("ipex_flash: no host memory for cache checks");
    *word = 0;
  }
  return word;
}

// The arguments out of range, by the names of the call that passed them.
std::string describe(uint32_t bits) {
  const bool serving = bits & kFoundByServingCall;
  std::string text;
  const auto add = [&](uint32_t bit, const std::string& what) {
    if (bits & bit) text += (text.empty() ? "" : "; ") + what;
  };
  add(kSeqlensOutOfRange,
      serving ? "seqused_k: a length below 0, or past max_seqlen_k or the block table's pages"
              : "cache_seqlens: a length below 0, or past the cache capacity once the new "
                "tokens are appended");
  add(kLeftpadOutOfRange, "cache_leftpad: a start below 0 or past its sequence's length");
  add(kPageOutOfRange, "block_table: an entry that is not a page index of the cache");
  add(kRotaryTooShort, "rotary_cos / rotary_sin: fewer rows than the positions read");
  add(kQueriesNotUniform,
      "cu_seqlens_q: not 0, 1, 2, ..., as max_seqlen_q = 1 and q's one row per sequence say");
  return text;
}

std::atomic<int64_t> reads{0};

// Per thread and context: the report of a read, which its thread waits for.
int32_t* report_words(sycl::queue& queue) {
  thread_local std::unordered_map<sycl::context, int32_t*> words;
  int32_t*& report = words[queue.get_context()];
  if (report == nullptr) {
    report = sycl::malloc_host<int32_t>(2, queue);
    if (report == nullptr) throw std::runtime_error("ipex_flash: no host memory for cache checks");
  }
  return report;
}

}  // namespace

FillView nan_fill_view(const TensorView& view, std::uintptr_t address) {
  FillView fill{reinterpret_cast<void*>(address), {1, 1, 1, 1}, {0, 0, 0, 0},
                view.dtype == "float32" ? 4 : 2};
  const size_t skip = 4 - view.sizes.size();  // (the LSE's three dims: a leading 1)
  for (size_t d = 0; d < view.sizes.size(); ++d) {
    fill.sizes[skip + d] = view.sizes[d];
    fill.strides[skip + d] = view.strides[d];
  }
  return fill;
}

KernelProgram cache_check_program(const DeviceLimits& limits) {
  KernelVariant variant{"float32", 0, 0, 0, 0};
  variant.cpu_device = limits.is_cpu;
  return {"programs/cache_check.hpp", {"ipex_flash::cache_check_kernel"}, program_options(variant)};
}

void check_cache_values(CacheCheckParams params, std::uintptr_t queue_handle) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  params.error = error_word(queue);
  params.report = nullptr;
  const sycl::kernel kernel =
      get_kernels(queue, cache_check_program(device_limits(queue.get_device())))[0];
  finish_launch(queue, queue_handle,
                submit_kernel(queue, kernel, params, block_range(1, 1, kCacheCheckGroup),
                              "cache_check"),
                "cache_check");
}

CacheValues read_cache_values(CacheCheckParams params, std::uintptr_t queue_handle) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  params.error = nullptr;
  params.out.data = params.lse.data = nullptr;
  params.report = report_words(queue);
  // (what a run with kernels skipped, for the host-cost benchmark, reads: no error, full)
  params.report[0] = 0;
  params.report[1] = params.capacity;
  const sycl::kernel kernel =
      get_kernels(queue, cache_check_program(device_limits(queue.get_device())))[0];
  sycl::event done =
      submit_kernel(queue, kernel, params, block_range(1, 1, kCacheCheckGroup), "cache_check");
  try {
    done.wait();
    queue.throw_asynchronous();
  } catch (const sycl::exception& e) {
    throw std::runtime_error(std::string("ipex_flash: cache_check failed on ") +
                             device_description(queue.get_device()) + ": " + e.what());
  }
  reads.fetch_add(1, std::memory_order_relaxed);
  return {static_cast<uint32_t>(params.report[0]), params.report[1]};
}

int64_t cache_value_reads() { return reads.load(std::memory_order_relaxed); }

void raise_cache_check_errors(std::uintptr_t queue_handle) {
  uint32_t* word = error_word(queue_from_handle(queue_handle));
  // (the device writes it: one atomic read-and-clear, no wait)
  const uint32_t bits = __atomic_exchange_n(word, 0u, __ATOMIC_ACQ_REL);
  if (bits == 0) return;
  const std::string call = bits & kFoundByServingCall
                               ? "ipex_flash.flash_attn_varlen_func (with block_table)"
                               : "ipex_flash.flash_attn_with_kvcache";
  throw std::invalid_argument(
      call + ": an earlier call on this device had values out of range (" + describe(bits) +
      "); that call's output and LSE were set to NaN, and its new tokens (if any) were not "
      "written where the lengths or block_table were out of range");
}

}  // namespace ipex_flash
