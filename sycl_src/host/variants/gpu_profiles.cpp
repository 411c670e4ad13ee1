// The Intel GPU profiles (pvc, bmg, dg2, lnl, mtl, arl-h): each GPU's limits as data, from
// which the variant policies choose that GPU's kernels on any machine (python -m ipex_flash
// plan --target bmg, gpu-check, the tests that run a GPU's variants on the CPU device).
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "host/variants/device_limits.hpp"

namespace ipex_flash {
namespace {

// Intel GPU profiles. Local memory per work-group from compute-runtime's tables; compute units
// as Level Zero reports them (vector engines) for the named part; matrix shapes as the
// runtime's matrix_combinations lists them for bf16 and fp16 with float32 accumulators.
std::vector<MatrixShape> xmx_shapes(int n) {
  std::vector<MatrixShape> shapes;
  for (const char* dtype : {"bfloat16", "float16"})
    shapes.push_back(MatrixShape{dtype, 0, n, 16, 8, 0, 0});  // M <= 8, N = n, K = 16
  return shapes;
}

DeviceLimits gpu_profile(const std::string& name, const std::string& title,
                         const std::string& ocloc_device, size_t local_kib,
                         std::vector<int> sub_groups, int compute_units,
                         std::vector<MatrixShape> matrix, bool large_grf,
                         bool matrix_by_default) {
  DeviceLimits limits;
  limits.name = name;
  limits.title = title;
  limits.ocloc_device = ocloc_device;
  limits.local_mem_bytes = local_kib * 1024;
  limits.max_work_group = 1024;
  limits.sub_group_sizes = std::move(sub_groups);
  limits.compute_units = compute_units;
  limits.matrix = std::move(matrix);
  limits.large_grf = large_grf;
  limits.fp8_decode = large_grf;
  limits.matrix_by_default = matrix_by_default;
  limits.matrix_lane_columns = true;
  return limits;
}

// The part's graphics clock, ALU lanes per vector engine and memory bandwidth, from its
// published specifications.
DeviceLimits with_throughput(DeviceLimits limits, int clock_mhz, int vector_lanes,
                             double memory_gb_per_s) {
  limits.clock_mhz = clock_mhz;
  limits.vector_lanes = vector_lanes;
  limits.memory_gb_per_s = memory_gb_per_s;
  return limits;
}

const std::map<std::string, DeviceLimits>& profiles() {
  static const std::map<std::string, DeviceLimits> table = {
      // Data Center GPU Max 1100 (Xe-HPC): XMX with sub-group 16, 8x16x16 tiles; 1550 MHz,
      // HBM2e at 1228.8 GB/s.
      {"pvc", with_throughput(gpu_profile("pvc", "Data Center GPU Max", "pvc", 128, {16, 32},
                                          448, xmx_shapes(16), true, true),
                              1550, 16, 1228.8)},
      // Arc B580 / Pro B60 (Xe2-HPG): the B580's 2670 MHz, GDDR6 at 456 GB/s.
      {"bmg", with_throughput(gpu_profile("bmg", "Battlemage", "bmg", 128, {16, 32}, 160,
                                          xmx_shapes(16), true, true),
                              2670, 16, 456)},
      // Arc A770 / A380 (Xe-HPG): XMX only with sub-group 8, N = 8 (the kernels' 8-wide form);
      // 64 KiB of SLM. The A770's 2100 MHz, GDDR6 at 560 GB/s.
      {"dg2", with_throughput(gpu_profile("dg2", "Arc A-series", "acm-g10", 64, {8, 16, 32},
                                          512, xmx_shapes(8), false, true),
                              2100, 8, 560)},
      // Lunar Lake's Arc 140V (Xe2-LPG): 1950 MHz, LPDDR5X-8533 at 136.5 GB/s.
      {"lnl", with_throughput(gpu_profile("lnl", "Lunar Lake", "lnl-m", 128, {16, 32}, 64,
                                          xmx_shapes(16), true, true),
                              1950, 16, 136.5)},
      // Meteor Lake's Arc (Xe-LPG): no XMX. 2250 MHz, LPDDR5X-7467 at 119.5 GB/s.
      {"mtl", with_throughput(gpu_profile("mtl", "Meteor Lake", "mtl-h", 64, {8, 16, 32}, 128,
                                          {}, false, false),
                              2250, 8, 119.5)},
      // Arrow Lake-H's Arc 140T (Xe-LPG+): DPAS with DG2's shape. 2350 MHz, LPDDR5X-8400 at
      // 134.4 GB/s.
      {"arl-h", with_throughput(gpu_profile("arl-h", "Arrow Lake-H", "arl-h", 64, {8, 16, 32},
                                            128, xmx_shapes(8), false, true),
                                2350, 8, 134.4)},
  };
  return table;
}

}  // namespace

DeviceLimits profile_limits(const std::string& name) {
  auto it = profiles().find(name);
  if (it == profiles().end()) {
    std::string known;
    for (const std::string& n : profile_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("ipex_flash: unknown GPU profile '" + name + "' (known: " +
                                known + ")");
  }
  return it->second;
}

std::vector<std::string> profile_names() {
  // In the order README's tables list them: data center, discrete, integrated.
  return {"pvc", "bmg", "dg2", "lnl", "mtl", "arl-h"};
}

}  // namespace ipex_flash
