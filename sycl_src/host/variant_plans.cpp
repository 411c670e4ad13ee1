// Python bindings for what a device would build, without running anything: the device-limits
// record (own device or a named GPU profile), the variant and program each kernel family picks
// for a problem, and the front-end compile gpu-check takes SPIR-V from.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "host/cache_check.hpp"
#include "host/device_limits.hpp"
#include "host/device_queue.hpp"
#include "host/device_sources.hpp"
#include "host/dropout_launch.hpp"
#include "host/flash_bwd_launch.hpp"
#include "host/flash_decode_launch.hpp"
#include "host/flash_fwd_launch.hpp"
#include "host/kv_append_launch.hpp"
#include "host/kernel_cache.hpp"
#include "host/matrix_layout_probe.hpp"
#include "host/matrix_path.hpp"
#include "device/probes/params.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace ipex_flash {
namespace {

py::dict limits_dict(const DeviceLimits& limits) {
  py::list matrix;
  for (const MatrixShape& s : limits.matrix)
    matrix.append(py::dict("dtype"_a = s.dtype, "m"_a = s.m, "n"_a = s.n, "k"_a = s.k,
                           "max_m"_a = s.max_m, "max_n"_a = s.max_n, "max_k"_a = s.max_k));
  return py::dict("name"_a = limits.name, "ocloc_device"_a = limits.ocloc_device,
                  "is_cpu"_a = limits.is_cpu, "local_mem_bytes"_a = limits.local_mem_bytes,
                  "max_work_group"_a = limits.max_work_group,
                  "sub_group_sizes"_a = limits.sub_group_sizes,
                  "compute_units"_a = limits.compute_units, "matrix"_a = matrix,
                  "matrix_by_default"_a = limits.matrix_by_default,
                  "large_grf"_a = limits.large_grf);
}

// "" names the SYCL CPU device (with any profile set_device_profile put on it).
DeviceLimits limits_named(const std::string& profile) {
  return profile.empty() ? device_limits(cpu_queue().get_device()) : profile_limits(profile);
}

// The variant and program of one kernel family for a problem (head_dim_v: v's head dim where
// it differs from head_dim, forward only; 0 for the same): "forward", "backward",
// "decode" (rows = query rows per K/V head), "dropout_mask", "cache_check" or "kv_append"
// (mode "rotary": with the rotary embedding, tables in the dtype).
py::dict plan(const std::string& family, const std::string& profile, const std::string& dtype,
              int head_dim, int features, int rows, const std::string& mode, int head_dim_v) {
  const DeviceLimits limits = limits_named(profile);
  KernelVariant variant{dtype, 0, 0, 0, features};
  KernelProgram program;
  if (family == "forward") {
    variant = fwd_variant(dtype, head_dim, head_dim_v, features, limits, mode);
    program = fwd_program(variant);
  } else if (family == "backward") {
    variant = bwd_variant(dtype, head_dim, features, limits, mode);
    program = bwd_program(variant);
  } else if (family == "decode") {
    variant = decode_variant(dtype, head_dim, rows, features, /*heads_interleaved=*/true, limits,
                             mode);
    program = decode_program(variant);
  } else if (family == "dropout_mask") {
    program = dropout_mask_program();
    variant.cpu_device = limits.is_cpu;
    program.options = program_options(variant);
  } else if (family == "cache_check") {  // (the KV-cache values' check, cache_check.hpp)
    program = cache_check_program(limits);
    variant.slm_bytes = kCacheCheckLocalBytes;
  } else if (family == "kv_append") {
    // (mode "quantise": bfloat16 keys and values into an FP8 cache of dtype)
    program = kv_append_program(dtype, mode == "quantise" ? "bfloat16" : dtype,
                                mode == "rotary" ? dtype : "", limits);
  } else {
    throw std::invalid_argument("ipex_flash: unknown kernel family '" + family + "'");
  }
  return py::dict("variant"_a = variant, "header"_a = program.header,
                  "kernels"_a = program.kernels, "options"_a = program.options,
                  "slm_bytes"_a = variant.slm_bytes);
}

}  // namespace

void bind_variant_plans(py::module_& m) {
  m.def("profile_names", &profile_names);
  m.def("profile_limits", [](const std::string& name) { return limits_dict(profile_limits(name)); },
        "name"_a);
  m.def("device_limits",
        [](std::uintptr_t queue) { return limits_dict(device_limits(queue_from_handle(queue).get_device())); },
        "queue"_a = 0);
  m.def("set_device_profile", &set_device_profile, "name"_a);
  m.def("plan", &plan, "family"_a, "profile"_a, "dtype"_a, "head_dim"_a = 64, "features"_a = 0,
        "rows"_a = 1, "mode"_a = "auto", "head_dim_v"_a = 0);
  m.def(
      "layout_probe_program",
      [](const KernelVariant& variant) {
        const KernelProgram program = layout_probe_program(variant);
        return py::dict("header"_a = program.header, "kernels"_a = program.kernels,
                        "options"_a = program.options);
      },
      "variant"_a);
  m.def(
      "compile_to_spirv",
      [](const std::string& header, const std::vector<std::string>& kernels,
         const std::vector<std::string>& options) {
        return compile_to_spirv(cpu_queue(), KernelProgram{header, kernels, options});
      },
      "header"_a, "kernels"_a, "options"_a, py::call_guard<py::gil_scoped_release>());
  // What gpu-check keeps its SPIR-V under, beside the kernel compiler's version.
  m.def("device_sources_hash", &device_sources_hash);
}

}  // namespace ipex_flash
