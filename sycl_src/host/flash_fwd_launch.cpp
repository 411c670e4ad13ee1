#include "host/flash_fwd_launch.hpp"

#include <cmath>
#include <stdexcept>

#include "host/device_queue.hpp"
#include "host/kernel_cache.hpp"

namespace ipex_flash {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kMinBlock = 16;  // one sub-group of query rows / one register chunk of keys

// Head dims are compiled in steps of 16 up to 128 and 32 beyond: few variants, and at most
// 15 (31) padding columns of zeros.
int padded_head_dim(int head_dim) {
  const int step = head_dim <= 128 ? 16 : 32;
  return (head_dim + step - 1) / step * step;
}

size_t fwd_slm_bytes(int head_dim, int block_m, int block_n) {
  // Q and the output accumulator (d, q), K and V blocks (kv, d), all float32.
  return sizeof(float) * (2 * static_cast<size_t>(head_dim) * block_m +
                          2 * static_cast<size_t>(block_n) * head_dim);
}

}  // namespace

std::string FwdVariant::kernel_name() const {
  return "ipex_flash::flash_fwd_kernel<" + device_type_name(dtype) + ", " +
         std::to_string(head_dim) + ", " + std::to_string(block_m) + ", " +
         std::to_string(block_n) + ">";
}

FwdVariant choose_fwd_variant(const std::string& dtype, int head_dim, const sycl::device& device) {
  if (head_dim < 1 || head_dim > kMaxHeadDim)
    throw std::invalid_argument("ipex_flash: head dim must be in [1, 256], got " +
                                std::to_string(head_dim));
  FwdVariant variant{dtype, padded_head_dim(head_dim), 64, 64};
  const size_t slm_limit = device.get_info<sycl::info::device::local_mem_size>();
  const size_t wg_limit = device.get_info<sycl::info::device::max_work_group_size>();
  while (variant.block_m > kMinBlock && static_cast<size_t>(variant.block_m) > wg_limit)
    variant.block_m /= 2;
  // Shrink the K/V block first: it only costs more barriers, while a smaller Q block
  // re-reads K and V more often.
  while (fwd_slm_bytes(variant.head_dim, variant.block_m, variant.block_n) > slm_limit) {
    if (variant.block_n > kMinBlock) variant.block_n /= 2;
    else if (variant.block_m > kMinBlock) variant.block_m /= 2;
    else throw std::runtime_error("ipex_flash: device local memory too small for head dim " +
                                  std::to_string(head_dim));
  }
  return variant;
}

void flash_fwd(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& out, const TensorView& lse, float scale,
               const MaskParams& mask, std::uintptr_t queue_handle) {
  const int64_t batch = q.size(0), heads_q = q.size(1), len_q = q.size(2), head_dim = q.size(3);
  const int64_t heads_kv = k.size(1), len_k = k.size(2);
  if (heads_kv <= 0 || heads_q % heads_kv != 0)
    throw std::invalid_argument("ipex_flash: query heads must be a multiple of key/value heads");
  if (batch == 0 || heads_q == 0 || len_q == 0) return;  // nothing to compute

  sycl::queue& queue = queue_from_handle(queue_handle);
  const FwdVariant variant = choose_fwd_variant(q.dtype, static_cast<int>(head_dim),
                                                queue.get_device());
  FwdParams params{};
  params.q = reinterpret_cast<const void*>(q.data);
  params.k = reinterpret_cast<const void*>(k.data);
  params.v = reinterpret_cast<const void*>(v.data);
  params.out = reinterpret_cast<void*>(out.data);
  params.lse = reinterpret_cast<float*>(lse.data);
  params.q_stride = bhnd_strides(q, "q");
  params.k_stride = bhnd_strides(k, "k");
  params.v_stride = bhnd_strides(v, "v");
  params.out_stride = bhnd_strides(out, "out");
  params.batch = static_cast<int32_t>(batch);
  params.heads_q = static_cast<int32_t>(heads_q);
  params.heads_per_kv = static_cast<int32_t>(heads_q / heads_kv);
  params.len_q = static_cast<int32_t>(len_q);
  params.len_k = static_cast<int32_t>(len_k);
  params.head_dim = static_cast<int32_t>(head_dim);
  params.num_q_blocks = static_cast<int32_t>((len_q + variant.block_m - 1) / variant.block_m);
  params.scale_log2 = static_cast<float>(scale * 1.4426950408889634);  // log2(e)
  params.mask = mask;

  sycl::kernel kernel = get_kernel(queue, "flash_fwd.hpp", variant.kernel_name());
  const size_t groups = static_cast<size_t>(batch * heads_q) * params.num_q_blocks;
  try {
    sycl::event done = queue.submit([&](sycl::handler& h) {
      h.set_args(params);
      h.parallel_for(sycl::nd_range<1>{groups * variant.block_m, size_t(variant.block_m)},
                     kernel);
    });
    if (needs_host_sync(queue_handle)) {
      done.wait();
      queue.throw_asynchronous();
    }
  } catch (const sycl::exception& e) {
    throw std::runtime_error(std::string("ipex_flash: flash_fwd kernel failed on ") +
                             device_description(queue.get_device()) + ": " + e.what());
  }
}

FwdVariant warmup_fwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  FwdVariant variant = choose_fwd_variant(dtype, head_dim, queue.get_device());
  get_kernel(queue, "flash_fwd.hpp", variant.kernel_name());
  return variant;
}

}  // namespace ipex_flash
