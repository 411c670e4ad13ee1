#include "host/launch/dropout_launch.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "host/launch/attention_options.hpp"
#include "host/launch/submit.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/runtime/kernel_cache.hpp"
#include "device/probes/params.hpp"

namespace ipex_flash {

DropoutParams make_dropout(double p, uint64_t seed, uint64_t offset) {
  if (!(p >= 0.0 && p < 1.0))
    throw std::invalid_argument("ipex_flash: dropout_p must be in [0, 1), got " + std::to_string(p));
  const double threshold = std::min(std::ldexp(p, 32), 4294967295.0);
  return DropoutParams{seed, offset, static_cast<uint32_t>(threshold),
                       static_cast<float>(1.0 / (1.0 - p)), p > 0.0 ? 1 : 0};
}

KernelProgram dropout_mask_program() {
  return {"programs/dropout_mask.hpp", {"ipex_flash::dropout_mask_kernel"}};
}

void dropout_mask(const TensorView& keep, const DropoutParams& dropout,
                  std::uintptr_t queue_handle) {
  if (keep.sizes.size() != 4 || keep.dtype != "uint8")
    throw std::invalid_argument("ipex_flash: keep must be a (B, H, Nq, Nk) uint8 tensor");
  DropoutMaskParams params{};
  params.keep = reinterpret_cast<uint8_t*>(keep.data);
  params.dims = AttentionDims{static_cast<int32_t>(keep.size(0)), static_cast<int32_t>(keep.size(1)),
                              1, static_cast<int32_t>(keep.size(2)),
                              static_cast<int32_t>(keep.size(3)), 0};
  params.dropout = dropout;
  const int64_t elements = keep.size(0) * keep.size(1) * keep.size(2) * keep.size(3);
  if (elements == 0) return;
  sycl::queue& queue = queue_from_handle(queue_handle);
  sycl::kernel kernel =
      get_kernels(queue, dropout_mask_program())[0];
  constexpr int kGroup = 64;
  sycl::event done = submit_kernel(queue, kernel, params,
                                   block_range(1, (elements + kGroup - 1) / kGroup, kGroup),
                                   "dropout_mask");
  finish_launch(queue, queue_handle, done, "dropout_mask");
}

}  // namespace ipex_flash
