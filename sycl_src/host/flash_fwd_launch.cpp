#include "host/flash_fwd_launch.hpp"

#include "host/device_queue.hpp"
#include "host/kernel_cache.hpp"
#include "host/launch.hpp"
#include "host/matrix_path.hpp"

namespace ipex_flash {
namespace {

size_t fwd_slm_bytes(int head_dim, int block_m, int block_n) {
  // Q and the output accumulator (d, q), K and V tiles (kv, d), all float32.
  return sizeof(float) * (2 * static_cast<size_t>(head_dim) * block_m +
                          2 * static_cast<size_t>(block_n) * head_dim);
}

size_t fwd_matrix_slm_bytes(int head_dim, int block_m, int block_n) {
  // Q (d, q), K and V (kv, d) and P (kv, q) in the 16-bit input dtype; scores (kv, q) and
  // the output accumulator (d, q) in float32.
  const size_t hd = head_dim, bm = block_m, bn = block_n;
  return 2 * (hd * bm + 2 * bn * hd + bn * bm) + sizeof(float) * (bn * bm + hd * bm);
}

KernelVariant fwd_variant(const std::string& dtype, int head_dim, const sycl::device& device) {
  const MatrixTile tile = matrix_tile(device, dtype, padded_head_dim(head_dim));
  KernelVariant variant = choose_variant(dtype, head_dim, device,
                                         tile.m > 0 ? fwd_matrix_slm_bytes : fwd_slm_bytes);
  variant.matrix_m = tile.m;
  variant.matrix_k = tile.k;
  return variant;
}

sycl::kernel fwd_kernel(sycl::queue& queue, const KernelVariant& variant) {
  if (variant.matrix_m > 0)
    return get_kernels(queue, "flash_fwd_matrix.hpp",
                       {variant.instantiate("ipex_flash::flash_fwd_matrix_kernel")})[0];
  return get_kernels(queue, "flash_fwd.hpp",
                     {variant.instantiate("ipex_flash::flash_fwd_kernel")})[0];
}

}  // namespace

void flash_fwd(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& out, const TensorView& lse, const AttentionOptions& options,
               std::uintptr_t queue_handle) {
  FwdParams params{};
  params.common = make_common(q, k, lse, options);
  AttentionCommon& c = params.common;
  if (c.dims.batch == 0 || c.dims.heads_q == 0 || c.dims.len_q <= 0) return;

  sycl::queue& queue = queue_from_handle(queue_handle);
  KernelVariant variant = fwd_variant(q.dtype, c.dims.head_dim, queue.get_device());
  variant.features = features_of(options);
  set_forward_tensors(params, q, k, v, out, lse);
  // Packed sequences are found through cu_seqlens, not a batch stride.
  if (options.cu_seqlens_q) params.q_stride.batch = params.out_stride.batch = 0;
  if (options.cu_seqlens_k) params.k_stride.batch = params.v_stride.batch = 0;
  c.num_blocks = static_cast<int32_t>(ceil_div(c.dims.len_q, variant.block_m));

  sycl::kernel kernel = fwd_kernel(queue, variant);
  const int64_t batch_heads = static_cast<int64_t>(c.dims.batch) * c.dims.heads_q;
  sycl::event done = submit_kernel(queue, kernel, params,
                                   block_range(batch_heads, c.num_blocks, variant.block_m),
                                   "flash_fwd");
  finish_launch(queue, queue_handle, done, "flash_fwd");
}

KernelVariant warmup_fwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  KernelVariant variant = fwd_variant(dtype, head_dim, queue.get_device());
  fwd_kernel(queue, variant);
  return variant;
}

}  // namespace ipex_flash
