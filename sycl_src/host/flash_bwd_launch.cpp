#include "host/flash_bwd_launch.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "host/device_queue.hpp"
#include "host/kernel_cache.hpp"
#include "host/launch.hpp"

namespace ipex_flash {
namespace {

constexpr int kPreprocessGroup = 64;

size_t bwd_slm_bytes(int head_dim, int block_m, int block_n) {
  const size_t d = head_dim, m = block_m, n = block_n;
  // dQ kernel: Q, dO, dQ (d, q) and K, V (kv, d). dK/dV kernel: K, V, dK, dV (d, kv),
  // Q, dO (q, d) and two per-row scalars. One variant serves both kernels.
  const size_t dq = 3 * d * m + 2 * n * d;
  const size_t dkdv = 4 * d * n + 2 * m * d + 2 * m;
  return sizeof(float) * std::max(dq, dkdv);
}

struct BwdKernels {
  sycl::kernel preprocess, dkdv, dq;
};

BwdKernels bwd_kernels(sycl::queue& queue, const KernelVariant& variant) {
  const std::vector<sycl::kernel> kernels = get_kernels(queue, bwd_program(variant));
  return BwdKernels{kernels[0], kernels[1], kernels[2]};
}

}  // namespace

KernelVariant bwd_variant(const std::string& dtype, int head_dim, int features,
                          const DeviceLimits& limits) {
  KernelVariant variant = choose_variant(dtype, head_dim, limits, bwd_slm_bytes);
  variant.features = features;
  return variant;
}

KernelProgram bwd_program(const KernelVariant& variant) {
  return {"flash_bwd.hpp",
          {"ipex_flash::flash_bwd_preprocess_kernel<" + device_type_name(variant.dtype) + ">",
           variant.instantiate("ipex_flash::flash_bwd_dkdv_kernel"),
           variant.instantiate("ipex_flash::flash_bwd_dq_kernel")},
          program_options(variant)};
}

void flash_bwd(const BwdTensors& t, const AttentionOptions& options,
               std::uintptr_t queue_handle) {
  if (options.block_table || options.seqlens_k)
    throw std::invalid_argument("ipex_flash: attention over a KV cache has no backward");
  BwdParams params{};
  params.common = make_common(t.q, t.k, t.lse, options);
  AttentionCommon& c = params.common;
  const AttentionDims& dims = c.dims;
  sycl::queue& queue = queue_from_handle(queue_handle);
  const KernelVariant variant = bwd_variant(t.q.dtype, dims.head_dim, features_of(options),
                                            device_limits(queue.get_device()));
  params.q = reinterpret_cast<const void*>(t.q.data);
  params.k = reinterpret_cast<const void*>(t.k.data);
  params.v = reinterpret_cast<const void*>(t.v.data);
  params.out = reinterpret_cast<const void*>(t.out.data);
  params.dout = reinterpret_cast<const void*>(t.dout.data);
  params.dq = reinterpret_cast<void*>(t.dq.data);
  params.dk = reinterpret_cast<void*>(t.dk.data);
  params.dv = reinterpret_cast<void*>(t.dv.data);
  params.lse = reinterpret_cast<const float*>(t.lse.data);
  params.delta = reinterpret_cast<float*>(t.delta.data);
  params.q_stride = bhnd_strides(t.q, "q");
  params.k_stride = bhnd_strides(t.k, "k");
  params.v_stride = bhnd_strides(t.v, "v");
  params.out_stride = bhnd_strides(t.out, "out");
  params.dout_stride = bhnd_strides(t.dout, "grad_out");
  params.dq_stride = bhnd_strides(t.dq, "dq");
  params.dk_stride = bhnd_strides(t.dk, "dk");
  params.dv_stride = bhnd_strides(t.dv, "dv");
  if (options.cu_seqlens_q)  // packed sequences are found through cu_seqlens
    params.q_stride.batch = params.out_stride.batch = params.dout_stride.batch =
        params.dq_stride.batch = 0;
  if (options.cu_seqlens_k)
    params.k_stride.batch = params.v_stride.batch = params.dk_stride.batch =
        params.dv_stride.batch = 0;
  const int64_t heads_kv = dims.heads_kv();
  if (dims.batch == 0 || heads_kv == 0 || dims.len_k <= 0) return;

  const BwdKernels kernels = bwd_kernels(queue, variant);
  sycl::event done;
  if (dims.len_q > 0) {
    const int64_t rows = static_cast<int64_t>(dims.batch) * dims.heads_q * dims.len_q;
    submit_kernel(queue, kernels.preprocess, params,
                  block_range(1, ceil_div(rows, kPreprocessGroup), kPreprocessGroup),
                  "flash_bwd_preprocess");
  }
  // dK and dV run over every key even with no query rows (they are then zero).
  c.num_blocks = static_cast<int32_t>(ceil_div(dims.len_k, variant.block_n));
  done = submit_kernel(queue, kernels.dkdv, params,
                       block_range(dims.batch * heads_kv, c.num_blocks, variant.block_n),
                       "flash_bwd_dkdv");
  if (dims.len_q > 0) {
    c.num_blocks = static_cast<int32_t>(ceil_div(dims.len_q, variant.block_m));
    done = submit_kernel(
        queue, kernels.dq, params,
        block_range(static_cast<int64_t>(dims.batch) * dims.heads_q, c.num_blocks,
                    variant.block_m),
        "flash_bwd_dq");
  }
  finish_launch(queue, queue_handle, done, "flash_bwd");
}

KernelVariant warmup_bwd(const std::string& dtype, int head_dim, std::uintptr_t queue_handle) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  const KernelVariant variant = bwd_variant(dtype, head_dim, 0, device_limits(queue.get_device()));
  bwd_kernels(queue, variant);
  return variant;
}

}  // namespace ipex_flash
