// Python bindings for what a device would build, without running anything: the device-limits
// record (own device or a named GPU profile), the variant and program each kernel family picks
// for a problem and why (variants/variant_plan.hpp), and the front-end compile gpu-check takes
// SPIR-V from.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "host/launch/backward_launch.hpp"
#include "host/launch/decode_launch.hpp"
#include "host/launch/forward_launch.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/runtime/device_sources.hpp"
#include "host/runtime/kernel_cache.hpp"
#include "host/runtime/matrix_layout_probe.hpp"
#include "host/variants/backward_variant.hpp"
#include "host/variants/decode_variant.hpp"
#include "host/variants/device_limits.hpp"
#include "host/variants/forward_variant.hpp"
#include "host/variants/variant_plan.hpp"

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
                  "large_grf"_a = limits.large_grf, "fp8_decode"_a = limits.fp8_decode,
                  "clock_mhz"_a = limits.clock_mhz,
                  "vector_lanes"_a = limits.vector_lanes,
                  "memory_gb_per_s"_a = limits.memory_gb_per_s);
}

// "" names the SYCL CPU device (with any profile set_device_profile put on it).
DeviceLimits limits_named(const std::string& profile) {
  return profile.empty() ? device_limits(cpu_queue().get_device()) : profile_limits(profile);
}

py::dict plan_dict(const VariantPlan& plan) {
  return py::dict("variant"_a = plan.variant, "header"_a = plan.program.header,
                  "kernels"_a = plan.program.kernels, "options"_a = plan.program.options,
                  "slm_bytes"_a = plan.variant.slm_bytes, "reasons"_a = plan.reasons);
}

// The variant and program of one kernel family for a problem on a named GPU profile ("": the
// CPU device's limits), and why it passed over faster forms: plan_variant (variant_plan.hpp).
py::dict plan(const std::string& family, const std::string& profile, const std::string& dtype,
              int head_dim, int features, int rows, const std::string& mode, int head_dim_v) {
  return plan_dict(plan_variant(family, limits_named(profile), dtype, head_dim, features, rows,
                                mode, head_dim_v));
}

// The same for the queue's device as a call gets it: under IPEX_FLASH_MATRIX, through the build
// guard and the tile-layout probe (which may build and run the probe kernel), whose fallbacks
// then appear among the reasons as in their warnings. Forward, backward and decode.
VariantPlan device_plan(const std::string& family, const std::string& dtype, int head_dim,
                        int features, int rows, int head_dim_v, std::uintptr_t queue_handle) {
  sycl::queue& queue = queue_from_handle(queue_handle);
  VariantPlan plan;
  if (family == "forward") {
    plan.variant = fwd_variant_on(queue, dtype, head_dim, head_dim_v, features, &plan.reasons);
    plan.program = fwd_program(plan.variant);
  } else if (family == "backward") {
    plan.variant = bwd_variant_on(queue, dtype, head_dim, features, &plan.reasons);
    plan.program = bwd_program(plan.variant);
  } else if (family == "decode") {
    plan.variant = decode_variant_on(queue, dtype, head_dim, rows, features,
                                     /*heads_interleaved=*/true, &plan.reasons, head_dim_v);
    plan.program = decode_program(plan.variant);
  } else {
    throw std::invalid_argument("ipex_flash: device_plan takes forward, backward or decode, got '" +
                                family + "'");
  }
  return plan;
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
      "device_plan",
      [](const std::string& family, const std::string& dtype, int head_dim, int features,
         int rows, int head_dim_v, std::uintptr_t queue) {
        VariantPlan chosen;
        {
          py::gil_scoped_release release;  // (a probe may build and run a kernel)
          chosen = device_plan(family, dtype, head_dim, features, rows, head_dim_v, queue);
        }
        return plan_dict(chosen);
      },
      "family"_a, "dtype"_a, "head_dim"_a = 64, "features"_a = 0, "rows"_a = 1,
      "head_dim_v"_a = 0, "queue"_a = 0);
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
