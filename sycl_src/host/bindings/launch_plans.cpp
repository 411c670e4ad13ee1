// The Python face of launch plans (launch_plan.hpp): C.LaunchPlan, C.PlanLimits, and the
// helpers the host-cost benchmark and the queue-handle tests use.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "host/launch/cache_check_launch.hpp"
#include "host/launch/submit.hpp"
#include "host/plans/launch_plan.hpp"
#include "host/runtime/device_queue.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace ipex_flash {

void bind_launch_plan(py::module_& m) {
  py::class_<PlanLimits>(m, "PlanLimits")
      .def(py::init([](int num_splits, int64_t min_keys, int64_t max_keys) {
             return PlanLimits{num_splits, min_keys, max_keys};
           }),
           "num_splits"_a = 0, "min_keys"_a = 0, "max_keys"_a = -1);
  py::class_<LaunchPlan>(m, "LaunchPlan")
      .def(py::init<TensorView, TensorView, TensorView, TensorView, TensorView, AttentionOptions,
                    PlanLimits, std::uintptr_t>(),
           "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "options"_a, "limits"_a, "queue"_a)
      .def_property_readonly("uses_decode_kernel", &LaunchPlan::uses_decode_kernel)
      .def_property_readonly("appends_in_decode", &LaunchPlan::appends_in_decode)
      .def_property_readonly("packed_queries", &LaunchPlan::packed_queries)
      .def_property_readonly("checks_on_device", &LaunchPlan::checks_on_device)
      .def_readonly_static("CHECK_ON_DEVICE", &LaunchPlan::kCheckOnDevice)
      .def_readonly_static("READ_ON_DEVICE", &LaunchPlan::kReadOnDevice)
      .def_readonly_static("PLAN_BOUND", &LaunchPlan::kPlanBound)
      .def("packed_sequences", &LaunchPlan::packed_sequences, "max_seqlen_k"_a)
      .def("uniform_queries", &LaunchPlan::uniform_queries)
      .def("append", &LaunchPlan::append, "k_new"_a, "v_new"_a)
      .def("rotary", &LaunchPlan::rotary, "cos"_a, "sin"_a, "interleaved"_a,
           "q_positions_advance"_a)
      // Positional addresses (q, k, v, out, lse, alibi_slopes, sinks, k_descale, v_descale,
      // seqlens_k, block_table, k_start, k_new, v_new, rotary_cos, rotary_sin, attn_mask,
      // cu_seqlens_q, cu_seqlens_k, max_len_k, queue, max_keys): keyword parsing would cost
      // more than the rest of the crossing.
      .def(
          "run",
          [](LaunchPlan& plan, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v,
             std::uintptr_t out, std::uintptr_t lse, std::uintptr_t alibi_slopes,
             std::uintptr_t sinks, std::uintptr_t k_descale, std::uintptr_t v_descale,
             std::uintptr_t seqlens_k, std::uintptr_t block_table, std::uintptr_t k_start,
             std::uintptr_t k_new, std::uintptr_t v_new, std::uintptr_t rotary_cos,
             std::uintptr_t rotary_sin, std::uintptr_t attn_mask, std::uintptr_t cu_seqlens_q,
             std::uintptr_t cu_seqlens_k, int64_t max_len_k, std::uintptr_t queue,
             int64_t max_keys) {
            return plan.run(PlanAddresses{q, k, v, out, lse, alibi_slopes, sinks, k_descale,
                                          v_descale, seqlens_k, block_table, k_start, k_new,
                                          v_new, rotary_cos, rotary_sin, attn_mask,
                                          cu_seqlens_q, cu_seqlens_k},
                            max_len_k, queue, max_keys);
          },
          py::call_guard<py::gil_scoped_release>());
  m.def("uniform_sequences", [](std::uintptr_t cu_seqlens, int64_t batch, int64_t length) {
    return uniform_offsets(reinterpret_cast<const int32_t*>(cu_seqlens), batch, length);
  });
  m.def("take_first_submission_ns", &take_first_submission_ns);
  m.def("skip_kernels", [](bool skip) { return kernels_skipped.exchange(skip); },
        "Time kernel submissions without running the kernels (host-cost benchmark only; outputs "
        "are left unwritten); returns the previous setting.");
  m.def("cache_value_reads", &cache_value_reads,
        "Reads of a KV cache's values on the device the host waited for, in this process.");
  m.def("cpu_queue_handle", [] { return reinterpret_cast<std::uintptr_t>(&cpu_queue()); });
}

}  // namespace ipex_flash
