// One build of a program at a time on a machine, across processes.
//
// The ranks of a job on one machine (torchrun's processes, a serving engine's workers, test
// workers) start together and ask for the same kernels. Each would compile each one, all at
// once, sharing the cores. With the lock, the first process builds a program and the others
// wait for it; the next one builds from the intermediate code the first left in the persistent
// cache and stores the device binary, which the rest then load. A program is a file lock
// (flock: released by the system when its holder exits, even by a crash) in a directory the
// Python package names, beside the persistent kernel cache.
#pragma once

#include <sycl/sycl.hpp>

#include <string>

namespace ipex_flash {

// Where the lock files go; empty (the default, and when the persistent cache is off) turns
// the lock off: every process then builds what it needs on its own.
void set_build_lock_dir(const std::string& dir);

// Holds the lock of `program_key` (a program's header, kernels and options) on `device` from
// construction to destruction. Waits for another process's build at most kWaitSeconds, then
// builds without the lock; a lock file that cannot be opened means no lock.
class ProgramBuildLock {
 public:
  ProgramBuildLock(const sycl::device& device, const std::string& program_key);
  ~ProgramBuildLock();
  ProgramBuildLock(const ProgramBuildLock&) = delete;
  ProgramBuildLock& operator=(const ProgramBuildLock&) = delete;

  static constexpr double kWaitSeconds = 1800.0;

 private:
  int fd_ = -1;
};

}  // namespace ipex_flash
