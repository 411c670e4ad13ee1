// The private extension module ipex_flash._C. The Python package validates arguments and
// allocates outputs; this module launches kernels on the right queue.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "host/launch/backward_launch.hpp"
#include "host/launch/decode_launch.hpp"
#include "host/launch/dropout_launch.hpp"
#include "host/launch/forward_launch.hpp"
#include "host/runtime/build_guard.hpp"
#include "host/runtime/build_lock.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/runtime/kernel_cache.hpp"
#include "host/variants/decode_or_general.hpp"
#include "host/variants/decode_variant.hpp"
#include "host/variants/device_limits.hpp"
#include "host/variants/kernel_variant.hpp"
#include "host/variants/skip_reasons.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace ipex_flash {

void bind_variant_plans(py::module_& m);  // variant_plans.cpp
void bind_launch_plan(py::module_& m);    // launch_plans.cpp

namespace {

py::dict device_info(std::uintptr_t queue_handle) {
  const sycl::device device = queue_from_handle(queue_handle).get_device();
  py::dict info;
  info["name"] = device.get_info<sycl::info::device::name>();
  info["platform"] = device.get_platform().get_info<sycl::info::platform::name>();
  info["driver_version"] = device.get_info<sycl::info::device::driver_version>();
  info["is_cpu"] = device.is_cpu();
  info["is_gpu"] = device.is_gpu();
  info["compute_units"] = device.get_info<sycl::info::device::max_compute_units>();
  info["local_mem_size"] = device.get_info<sycl::info::device::local_mem_size>();
  info["max_work_group_size"] = device.get_info<sycl::info::device::max_work_group_size>();
  info["sub_group_sizes"] = device.get_info<sycl::info::device::sub_group_sizes>();
  info["matrix_engine"] = !device_limits(device).matrix.empty();
  return info;
}

}  // namespace
}  // namespace ipex_flash

PYBIND11_MODULE(_C, m) {
  using namespace ipex_flash;
  m.doc() = "ipex_flash host module: SYCL kernel build cache and launchers";

  py::class_<TensorView>(m, "TensorView")
      .def(py::init<std::uintptr_t, std::string, std::vector<int64_t>, std::vector<int64_t>>(),
           "data"_a, "dtype"_a, "sizes"_a, "strides"_a)
      .def_readonly("dtype", &TensorView::dtype)
      .def_readonly("sizes", &TensorView::sizes)
      .def_readonly("strides", &TensorView::strides);
  m.def("rows_overlap", &rows_overlap, "a"_a, "b"_a,
        "Whether the same row of two views (addresses: data pointers, or offsets in one "
        "storage) shares memory (launch/tensor_view.hpp)");

  py::class_<MaskParams>(m, "MaskParams")
      .def(py::init([](int32_t window_left, int32_t window_right, bool bottom_right) {
             return MaskParams{window_left, window_right, bottom_right ? 1 : 0};
           }),
           "window_left"_a, "window_right"_a, "bottom_right"_a)
      .def_readonly("window_left", &MaskParams::window_left)
      .def_readonly("window_right", &MaskParams::window_right)
      .def_readonly("bottom_right", &MaskParams::bottom_right);

  py::class_<KernelVariant>(m, "KernelVariant")
      .def_readonly("dtype", &KernelVariant::dtype)
      .def_readonly("head_dim", &KernelVariant::head_dim)
      .def_readonly("head_dim_v", &KernelVariant::head_dim_v)
      .def_readonly("block_m", &KernelVariant::block_m)
      .def_readonly("block_n", &KernelVariant::block_n)
      .def_readonly("matrix_m", &KernelVariant::matrix_m)
      .def_readonly("matrix_k", &KernelVariant::matrix_k)
      .def_readonly("matrix_n", &KernelVariant::matrix_n)
      .def_readonly("matrix_emulated", &KernelVariant::matrix_emulated)
      .def_readonly("matrix_registers", &KernelVariant::matrix_registers)
      .def_readonly("dkdv_registers", &KernelVariant::dkdv_registers)
      .def_readonly("value_split", &KernelVariant::value_split)
      .def_readonly("kv_cols", &KernelVariant::kv_cols)
      .def_readonly("features", &KernelVariant::features)
      .def_readonly("slm_bytes", &KernelVariant::slm_bytes)
      .def_readonly("large_grf", &KernelVariant::large_grf)
      .def("__repr__", [](const KernelVariant& v) { return v.instantiate("KernelVariant"); });

  py::class_<DropoutParams>(m, "DropoutParams")
      .def(py::init(&make_dropout), "p"_a, "seed"_a, "offset"_a)
      .def_readonly("seed", &DropoutParams::seed)
      .def_readonly("offset", &DropoutParams::offset)
      .def_readonly("threshold", &DropoutParams::threshold)
      .def_readonly("keep_scale", &DropoutParams::keep_scale);

  py::class_<AttentionOptions>(m, "AttentionOptions")
      .def(py::init<>())
      .def_readwrite("scale", &AttentionOptions::scale)
      .def_readwrite("mask", &AttentionOptions::mask)
      .def_readwrite("dropout", &AttentionOptions::dropout)
      .def_readwrite("softcap", &AttentionOptions::softcap)
      .def_readwrite("alibi_slopes", &AttentionOptions::alibi_slopes)
      .def_readwrite("attn_mask", &AttentionOptions::attn_mask)
      .def_readwrite("sinks", &AttentionOptions::sinks)
      .def_readwrite("k_descale", &AttentionOptions::k_descale)
      .def_readwrite("v_descale", &AttentionOptions::v_descale)
      .def_readwrite("cu_seqlens_q", &AttentionOptions::cu_seqlens_q)
      .def_readwrite("cu_seqlens_k", &AttentionOptions::cu_seqlens_k)
      .def_readwrite("seqlens_k", &AttentionOptions::seqlens_k)
      .def_readwrite("block_table", &AttentionOptions::block_table)
      .def_readwrite("k_start", &AttentionOptions::k_start)
      .def_readwrite("cu_keys_used", &AttentionOptions::cu_keys_used)
      .def_readwrite("keys_used", &AttentionOptions::keys_used)
      .def_readwrite("positions", &AttentionOptions::positions)
      .def_readwrite("page_size", &AttentionOptions::page_size)
      .def_readwrite("max_seqlen_q", &AttentionOptions::max_seqlen_q)
      .def_readwrite("max_seqlen_k", &AttentionOptions::max_seqlen_k);

  // The launchers release the GIL: a kernel may run for seconds, and other Python threads
  // (and concurrent calls, which the kernel cache serialises safely) should not stall.
  m.def("fwd_scratch_bytes", &fwd_scratch_bytes, "q"_a, "k"_a, "v"_a, "options"_a, "queue"_a);
  m.def("flash_fwd", &flash_fwd, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "scratch"_a, "options"_a,
        "queue"_a,
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_scratch_bytes", &decode_scratch_bytes, "q"_a, "k"_a, "v"_a, "options"_a,
        "queue"_a);
  m.def("flash_decode", &flash_decode, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "partial_out"_a,
        "partial_lse"_a, "options"_a, "queue"_a, "scratch"_a = TensorView{},
        py::call_guard<py::gil_scoped_release>());
  // The decisions Python reads rather than repeats (variants/decode_or_general.hpp,
  // decode_variant.hpp, kernel_variant.hpp).
  m.def("flash_decode_supported", &flash_decode_supported, "q"_a, "k"_a, "v"_a, "queue"_a);
  m.def("takes_decode_kernel", &takes_decode_kernel, "q"_a, "k"_a, "v"_a, "options"_a,
        "backward_follows"_a, "queue"_a);
  m.def(
      "decode_serves_rows",
      [](int64_t rows, int64_t new_tokens, int64_t heads_kv) {
        SkipReasons why;
        const bool serves = decode_serves_rows(rows, new_tokens, heads_kv, &why);
        return py::make_tuple(serves, why);
      },
      "rows"_a, "new_tokens"_a, "heads_kv"_a,
      "(whether the decode kernel serves these query rows per K/V head, the reason if not)");
  m.def(
      "decode_fits",
      [](const std::string& dtype, int head_dim, int rows, int features,
         const std::string& profile, std::uintptr_t queue) {
        const DeviceLimits limits = profile.empty()
                                        ? device_limits(queue_from_handle(queue).get_device())
                                        : profile_limits(profile);
        SkipReasons why;
        const bool fits = decode_fits(dtype, head_dim, rows, features, limits, &why);
        return py::make_tuple(fits, why);
      },
      "dtype"_a, "head_dim"_a, "rows"_a, "features"_a = 0, "profile"_a = "", "queue"_a = 0,
      "(whether the decode kernel fits the local memory of a GPU profile, or of the queue's "
      "device for profile '', the reason if not: the general kernel then serves the call)");
  m.attr("MAX_HEAD_DIM") = kMaxHeadDim;        // v's (kernel_variant.hpp)
  m.attr("MAX_QK_HEAD_DIM") = kMaxQkHeadDim;  // q's and k's
  m.attr("DECODE_MIN_BLOCK_KEYS") = kMinDecodeBlockKeys;
  m.def("most_splits", &most_splits, "keys"_a,
        "The most splits the decode kernel can use over `keys` keys: each is a whole number of "
        "key blocks, so splits past one per smallest block would be empty (and their float32 "
        "scratch, rows x splits x Dv, would outgrow the cache itself).");
  m.def(
      "flash_decode_variant",
      [](const TensorView& q, const TensorView& k, const TensorView& v, std::uintptr_t queue) {
        return flash_decode_variant(q, k, v, AttentionOptions{}, queue);
      },
      "q"_a, "k"_a, "v"_a, "queue"_a);
  m.def(
      "decode_num_splits",
      [](int batch, int heads_kv, int rows, int head_dim, int64_t max_len_k,
         std::uintptr_t queue, int64_t num_splits) {
        return decode_splits(num_splits, batch, heads_kv, rows, head_dim, max_len_k, queue);
      },
      "batch"_a, "heads_kv"_a, "rows"_a, "head_dim"_a, "max_len_k"_a, "queue"_a,
      "num_splits"_a = 0);
  m.def("warmup_decode", &warmup_decode, "dtype"_a, "head_dim"_a, "rows"_a, "queue"_a,
        "head_dim_v"_a = 0, py::call_guard<py::gil_scoped_release>());
  m.attr("MAX_DECODE_ROWS") = kMaxDecodeRows;
  m.attr("FEATURE_KEY_STREAMS") = FEATURE_KEY_STREAMS;
  m.attr("FEATURE_VALUE_DIM") = FEATURE_VALUE_DIM;
  m.def("features_of", &features_of, "options"_a, "k"_a,
        "The FEATURE_* bits a call with these options needs compiled in (k: its K/V dtype).");
  m.def("max_sliced_decode_tokens", &max_sliced_decode_tokens, "heads_kv"_a);
  m.def("dropout_mask", &dropout_mask, "keep"_a, "dropout"_a, "queue"_a,
        py::call_guard<py::gil_scoped_release>());
  m.def("warmup_fwd", &warmup_fwd, "dtype"_a, "head_dim"_a, "queue"_a,
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "flash_bwd",
      [](const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
         const TensorView& dout, const TensorView& lse, const TensorView& dq,
         const TensorView& dk, const TensorView& dv, const TensorView& delta,
         const TensorView& scratch, const AttentionOptions& options, std::uintptr_t queue) {
        flash_bwd(BwdTensors{q, k, v, out, dout, lse, dq, dk, dv, delta, scratch}, options,
                  queue);
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, "delta"_a,
      "scratch"_a, "options"_a, "queue"_a, py::call_guard<py::gil_scoped_release>());
  m.def("bwd_scratch_bytes", &bwd_scratch_bytes, "q"_a, "k"_a, "v"_a, "options"_a, "queue"_a);
  m.def("warmup_bwd", &warmup_bwd, "dtype"_a, "head_dim"_a, "queue"_a,
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "build_kernel",
      [](const std::string& header, const std::string& kernel_name, std::uintptr_t queue) {
        get_kernels(queue_from_handle(queue), KernelProgram{header, {kernel_name}});
      },
      "header"_a, "kernel_name"_a, "queue"_a = 0, py::call_guard<py::gil_scoped_release>());
  m.def("device_info", &device_info, "queue"_a = 0);
  bind_variant_plans(m);
  bind_launch_plan(m);
  m.def("set_cpu_matrix_engine", &set_cpu_matrix_engine, "available"_a);
  m.def("set_warmup_mode", &set_warmup_mode, "on"_a);
  m.def("set_build_lock_dir", &set_build_lock_dir, "dir"_a);
  m.def(
      "set_build_guard",
      [](const std::string& python, const std::string& module_path,
         const std::string& verdict_dir) {
        auto warn = [](const std::string& message) {
          py::gil_scoped_acquire gil;  // called from launches that released it
          if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0)
            throw py::error_already_set();  // warnings turned into errors
        };
        set_build_guard(BuildGuard{python, module_path, verdict_dir, warn});
      },
      "python"_a, "module_path"_a, "verdict_dir"_a);
  m.def(
      "probe_build",
      [](int device_index, const std::string& header, const std::vector<std::string>& kernels,
         const std::vector<std::string>& options) {
        return probe_build(device_index, KernelProgram{header, kernels, options});
      },
      "device_index"_a, "header"_a, "kernels"_a, "options"_a,
      py::call_guard<py::gil_scoped_release>());
  m.def("kernel_cache_stats", [] {
    const KernelCacheStats stats = kernel_cache_stats();
    return py::dict("builds"_a = stats.builds, "hits"_a = stats.hits);
  });
}
