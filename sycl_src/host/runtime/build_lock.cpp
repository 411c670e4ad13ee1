#include "host/runtime/build_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "host/runtime/device_queue.hpp"
#include "host/runtime/device_sources.hpp"

namespace ipex_flash {
namespace {

std::mutex dir_mutex;
std::string& lock_dir() {
  static std::string* dir = new std::string();  // never destroyed, like the kernel cache
  return *dir;
}

// The lock file of a program on a device, for the device sources of this build.
std::string lock_path(const std::string& dir, const sycl::device& device,
                      const std::string& program_key) {
  char name[48];
  std::snprintf(name, sizeof(name), "%016llx-%016llx.lock",
                static_cast<unsigned long long>(
                    fnv1a(device_description(device) + "|" + program_key)),
                static_cast<unsigned long long>(device_sources_hash()));
  return dir + "/" + name;
}

}  // namespace

void set_build_lock_dir(const std::string& dir) {
  std::lock_guard<std::mutex> guard(dir_mutex);
  lock_dir() = dir;
}

ProgramBuildLock::ProgramBuildLock(const sycl::device& device, const std::string& program_key) {
  std::string dir;
  {
    std::lock_guard<std::mutex> guard(dir_mutex);
    dir = lock_dir();
  }
  if (dir.empty()) return;
  fd_ = open(lock_path(dir, device, program_key).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) return;
  // Polled rather than blocking, so a build that never ends elsewhere costs a bounded wait.
  const auto start = std::chrono::steady_clock::now();
  while (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const bool waited_out = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                          start).count() > kWaitSeconds;
    if ((errno != EWOULDBLOCK && errno != EINTR) || waited_out) {
      close(fd_);
      fd_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

ProgramBuildLock::~ProgramBuildLock() {
  if (fd_ >= 0) close(fd_);  // closing the last descriptor releases the lock
}

}  // namespace ipex_flash
