#include "host/runtime/build_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>

#include "host/runtime/device_queue.hpp"

namespace ipex_flash {
namespace {

std::mutex dir_mutex;
std::string& lock_dir() {
  static std::string* dir = new std::string();  // never destroyed, like the kernel cache
  return *dir;
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
  const std::string path = dir + "/" + program_record_key(device, program_key) + ".lock";
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
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
