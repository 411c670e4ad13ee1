// The small-call path of ipex_flash.scaled_dot_product_attention on the SYCL CPU device: few
// query rows per K/V head (decoding, short queries), no mask, sinks, softcap or dropout. What a
// call needs besides its output tensors (views, options, the split scratch) is made here, in
// one crossing from Python: made in Python, it cost more than the decode kernels themselves.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <vector>

#include "host/flash_decode_launch.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace ipex_flash {
namespace {

using Dims = std::array<int64_t, 4>;

TensorView make_view(std::uintptr_t data, const std::string& dtype, std::vector<int64_t> sizes,
                     std::vector<int64_t> strides) {
  return TensorView{data, dtype, std::move(sizes), std::move(strides)};
}

std::vector<int64_t> to_vector(const Dims& dims) { return {dims.begin(), dims.end()}; }

// Runs the call and returns true, or returns false (nothing done) for anything outside the
// path; the caller then takes the general path, whose checks name what is wrong.
bool small_call_cpu(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t out,
                    std::uintptr_t lse, const std::string& dtype, const Dims& q_sizes,
                    const Dims& q_strides, const Dims& k_sizes, const Dims& k_strides,
                    const Dims& v_strides, const Dims& out_strides, float scale, bool causal) {
  const int64_t batch = q_sizes[0], heads_q = q_sizes[1], len_q = q_sizes[2];
  const int64_t head_dim = q_sizes[3], heads_kv = k_sizes[1], len_k = k_sizes[2];
  if (batch < 1 || len_q < 1 || len_k < 1 || head_dim < 1 || head_dim > 256 || heads_kv < 1 ||
      heads_q % heads_kv != 0 || k_sizes[0] != batch || k_sizes[3] != head_dim)
    return false;
  for (const Dims* strides : {&q_strides, &k_strides, &v_strides, &out_strides})
    if ((*strides)[3] != 1 && head_dim > 1) return false;
  const TensorView q_view = make_view(q, dtype, to_vector(q_sizes), to_vector(q_strides));
  const TensorView k_view = make_view(k, dtype, to_vector(k_sizes), to_vector(k_strides));
  const TensorView v_view = make_view(v, dtype, to_vector(k_sizes), to_vector(v_strides));
  if (!flash_decode_supported(q_view, k_view, v_view, /*queue_handle=*/0)) return false;

  const int rows = static_cast<int>((heads_q / heads_kv) * len_q);
  const int splits = decode_num_splits(static_cast<int>(batch), static_cast<int>(heads_kv), rows,
                                       static_cast<int>(head_dim), static_cast<int>(len_k), 0);
  // Kernels on the CPU device read host memory directly, and flash_decode waits for them:
  // the scratch can be reused by the thread's next call.
  thread_local std::vector<float> scratch;
  const int64_t partial_rows = batch * heads_q * len_q * splits;
  scratch.resize(static_cast<size_t>(partial_rows * (head_dim + 1)));
  const auto address = [](float* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const TensorView partial_out =
      make_view(address(scratch.data()), "float32", {batch, heads_q, len_q, splits, head_dim},
                {heads_q * len_q * splits * head_dim, len_q * splits * head_dim,
                 splits * head_dim, head_dim, 1});
  const TensorView partial_lse =
      make_view(address(scratch.data() + partial_rows * head_dim), "float32",
                {batch, heads_q, len_q, splits},
                {heads_q * len_q * splits, len_q * splits, splits, 1});

  AttentionOptions options;
  options.scale = scale;
  options.mask = MaskParams{-1, causal ? 0 : -1, 0};  // top-left causal, as in SDPA
  flash_decode(q_view, k_view, v_view,
               make_view(out, dtype, to_vector(q_sizes), to_vector(out_strides)),
               make_view(lse, "float32", {batch, heads_q, len_q},
                         {heads_q * len_q, len_q, 1}),
               partial_out, partial_lse, options, 0);
  return true;
}

}  // namespace

void bind_small_call(py::module_& m) {
  m.def("small_call_cpu", &small_call_cpu, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dtype"_a,
        "q_sizes"_a, "q_strides"_a, "k_sizes"_a, "k_strides"_a, "v_strides"_a, "out_strides"_a,
        "scale"_a, "causal"_a, py::call_guard<py::gil_scoped_release>());
}

}  // namespace ipex_flash
