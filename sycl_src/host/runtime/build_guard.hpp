// A first build of each matrix-engine program in a child process.
//
// The device's compiler runs inside the calling process (the OpenCL CPU runtime's LLVM, IGC
// under Level Zero). On a Xeon with AMX it has crashed while building the bf16 matrix backward
// with an attention mask (LLVM's "Lower AMX type for load/store" pass): a segmentation fault
// that no exception handler sees. A child process that builds the program first takes such a
// crash instead; the caller then runs the vector kernels. The child's verdict is kept on disk
// (one small file per program, device, driver and device source), so each program is tried
// once, and its build has also filled the persistent kernel cache the caller then loads from.
#pragma once

#include <sycl/sycl.hpp>

#include <functional>
#include <string>

#include "host/variants/kernel_variant.hpp"
#include "host/variants/matrix_engine.hpp"
#include "host/variants/skip_reasons.hpp"

namespace ipex_flash {

struct BuildGuard {
  std::string python;       // interpreter that runs the child (sys.executable)
  std::string module_path;  // this host module's file: the child loads it alone, without torch
  std::string verdict_dir;  // where verdicts are kept across processes
  // Called once per process for each program the guard turns away, with a message naming it.
  std::function<void(const std::string&)> warn;
};

// Enables the guard (the Python package does on import). Without it every program is built
// in the calling process.
void set_build_guard(BuildGuard guard);

// Passes `message` to the guard's warn (a Python RuntimeWarning), or stderr without a guard.
// Not to be called with a lock held that a Python thread may wait on (it takes the GIL).
void guard_warn(const std::string& message);

// Whether `variant`'s `program` may be built in this process. True for programs the guard does
// not cover and for those a child built; false, after one warning per process, for those whose
// build failed or crashed in a child. IPEX_FLASH_BUILD_GUARD chooses what is covered: unset or
// "matrix", real matrix-engine programs; "all", emulated matrix programs too (so tests can
// exercise the guard on any CPU); "0", none.
bool program_builds(sycl::queue& queue, const KernelProgram& program,
                    const KernelVariant& variant);

// The variant `choose(mode, why)` picks under IPEX_FLASH_MATRIX's mode, or the one it picks
// under "0" (the vector kernels) where the device's compiler cannot build the matrix program
// that `program_of` gives for it. why: the chosen variant's reasons (skip_reasons.hpp), or
// kBuildRefused for the fallback.
template <typename Choose, typename ProgramOf>
KernelVariant buildable_variant(sycl::queue& queue, const Choose& choose,
                                const ProgramOf& program_of, SkipReasons* why = nullptr) {
  SkipReasons reasons;
  const KernelVariant variant = choose(matrix_mode(), why ? &reasons : nullptr);
  if (program_builds(queue, program_of(variant), variant)) {
    add_reasons(why, reasons);
    return variant;
  }
  if (why) why->push_back(kBuildRefused);
  return choose("0", nullptr);
}

// The child's side: builds `program` for device `device_index` of sycl::device::get_devices().
// Returns 0 when it builds, kProbeBuildFailed when the compiler reports an error (printed to
// stderr). IPEX_FLASH_TEST_CRASH_BUILD, when it names part of a kernel of the program, makes the
// child die of SIGSEGV instead, as the crashing compiler did: the seam that tests the guard.
constexpr int kProbeBuildFailed = 3;
int probe_build(int device_index, const KernelProgram& program);

}  // namespace ipex_flash
