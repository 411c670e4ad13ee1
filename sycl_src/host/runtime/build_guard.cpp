#include "host/runtime/build_guard.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include "host/runtime/device_queue.hpp"
#include "host/runtime/kernel_cache.hpp"

extern char** environ;

namespace ipex_flash {
namespace {

// Loads the host module by its path, so the child imports neither torch nor the package.
constexpr const char* kProbeScript =
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('ipex_flash._C', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "n = int(sys.argv[4])\n"
    "sys.exit(module.probe_build(int(sys.argv[2]), sys.argv[3], sys.argv[5:5 + n], "
    "sys.argv[5 + n:]))\n";

// A child still building after this long is taken to hang, as the compiler would here.
constexpr double kProbeTimeoutSeconds = 1800.0;

// The child's exit status when it cannot find the caller's device: no verdict on the program.
constexpr int kProbeNoDevice = 4;

struct Verdict {
  bool builds = true;
  std::string reason;  // why not, for the warning
};

struct GuardState {
  std::mutex mutex;
  BuildGuard guard;
  bool enabled = false;
  // This process's verdicts, by device and program_text: a lookup per call, so nothing in it
  // asks the device anything.
  std::unordered_map<std::string, Verdict> verdicts;
};

GuardState& state() {
  static GuardState* instance = new GuardState();  // never destroyed, like the kernel cache
  return *instance;
}

std::string joined_kernels(const KernelProgram& program) {
  std::string joined;
  for (const std::string& name : program.kernels) joined += (joined.empty() ? "" : ", ") + name;
  return joined;
}

// The program's header, kernels and build options in one string.
std::string program_text(const KernelProgram& program) {
  std::string text = program.header + "|" + joined_kernels(program);
  for (const std::string& option : program.options) text += "|" + option;
  return text;
}

bool covered(const KernelVariant& variant) {
  if (variant.matrix_m == 0) return false;
  const char* env = std::getenv("IPEX_FLASH_BUILD_GUARD");
  const std::string mode = env == nullptr || *env == '\0' ? "matrix" : env;
  if (mode == "0") return false;
  if (mode == "all") return true;
  if (mode == "matrix") return !variant.matrix_emulated;
  throw std::invalid_argument(
      "ipex_flash: IPEX_FLASH_BUILD_GUARD must be matrix, all or 0, got '" + mode + "'");
}

int device_index(const sycl::device& device) {
  const std::vector<sycl::device> devices = sycl::device::get_devices();
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i] == device) return static_cast<int>(i);
  return -1;
}

// How a child's run ended: its wait status, or why there is none.
struct ProbeRun {
  enum Outcome { kExited, kNotStarted, kTimedOut } outcome;
  int status = 0;       // waitpid's, for kExited
  std::string reason;   // for the others
};

ProbeRun run_probe(const BuildGuard& guard, int device, const KernelProgram& program,
                   const std::string& log_path) {
  std::vector<std::string> args = {guard.python, "-I", "-c", kProbeScript, guard.module_path,
                                   std::to_string(device), program.header,
                                   std::to_string(program.kernels.size())};
  args.insert(args.end(), program.kernels.begin(), program.kernels.end());
  args.insert(args.end(), program.options.begin(), program.options.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  const int spawned =
      posix_spawn(&pid, guard.python.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0)
    return {ProbeRun::kNotStarted, 0,
            std::string("could not start ") + guard.python + ": " + std::strerror(spawned)};
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return {ProbeRun::kExited, status, ""};
    if (done < 0 && errno != EINTR)
      return {ProbeRun::kNotStarted, 0, std::string("lost the child: ") + std::strerror(errno)};
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kProbeTimeoutSeconds) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return {ProbeRun::kTimedOut, 0,
              "the build did not finish in " + std::to_string(int(kProbeTimeoutSeconds)) + " s"};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The child's verdict on `program`. `recorded` is false when the child could not tell (it did
// not start, or failed before building): then nothing is kept and the program is built here.
Verdict probe(const BuildGuard& guard, const sycl::device& device, const KernelProgram& program,
              const std::string& key, bool& recorded) {
  recorded = false;
  const int index = device_index(device);
  if (index < 0) return {true, ""};
  const std::string log_path = guard.verdict_dir + "/" + key + ".log";
  const ProbeRun run = run_probe(guard, index, program, log_path);
  if (run.outcome == ProbeRun::kNotStarted) return {true, run.reason};
  recorded = true;
  if (run.outcome == ProbeRun::kTimedOut) return {false, run.reason};
  const int status = run.status;
  if (WIFSIGNALED(status))
    return {false, std::string("the compiler crashed (") + strsignal(WTERMSIG(status)) +
                       "); its output: " + log_path};
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {true, ""};
  if (WIFEXITED(status) && WEXITSTATUS(status) == kProbeBuildFailed)
    return {false, "the compiler reported an error; its output: " + log_path};
  recorded = false;  // the child failed before building: not a verdict on the program
  return {true, "the child process exited with status " +
                    std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : status) +
                    " before building; its output: " + log_path};
}

bool read_verdict(const std::string& path_base, Verdict& verdict) {
  std::ifstream ok(path_base + ".ok");
  if (ok) {
    verdict = {true, ""};
    return true;
  }
  std::ifstream failed(path_base + ".failed");
  if (!failed) return false;
  std::stringstream text;
  text << failed.rdbuf();
  verdict = {false, text.str() + " (kept in " + path_base + ".failed; delete it to try again)"};
  return true;
}

void write_verdict(const std::string& path_base, const Verdict& verdict) {
  const std::string path = path_base + (verdict.builds ? ".ok" : ".failed");
  const std::string temporary = path + "." + std::to_string(getpid());
  {
    std::ofstream out(temporary);
    if (!out) return;  // an unwritable cache: the verdict holds for this process only
    out << verdict.reason;
  }
  std::rename(temporary.c_str(), path.c_str());  // whole, or not at all, for other processes
}

}  // namespace

void set_build_guard(BuildGuard guard) {
  GuardState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.enabled = !guard.python.empty() && !guard.module_path.empty() && !guard.verdict_dir.empty();
  s.guard = std::move(guard);
}

void guard_warn(const std::string& message) {
  std::function<void(const std::string&)> warn;
  {
    GuardState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    warn = s.guard.warn;
  }
  if (warn)
    warn(message);
  else
    std::cerr << message << std::endl;
}

bool program_builds(sycl::queue& queue, const KernelProgram& program,
                    const KernelVariant& variant) {
  if (!covered(variant)) return true;
  GuardState& s = state();
  const sycl::device device = queue.get_device();
  const std::string text = program_text(program);
  const std::string process_key = std::to_string(std::hash<sycl::device>{}(device)) + "|" + text;
  Verdict verdict;
  std::string unchecked;  // why the child could not tell, if it could not
  std::function<void(const std::string&)> warn;
  {
    // Held across the child's build: concurrent first calls of one program run it once. Not
    // held while warning, which takes the GIL (a Python thread may be waiting here with it).
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.enabled) return true;
    auto known = s.verdicts.find(process_key);
    if (known != s.verdicts.end()) return known->second.builds;
    const std::string key = program_record_key(device, text);
    const std::string path_base = s.guard.verdict_dir + "/" + key;
    if (!read_verdict(path_base, verdict)) {
      bool recorded = false;
      verdict = probe(s.guard, device, program, key, recorded);
      if (recorded) write_verdict(path_base, verdict);
      else unchecked = verdict.reason;
    }
    s.verdicts.emplace(process_key, verdict);
    warn = s.guard.warn;
  }
  if (!warn) return verdict.builds;
  if (!unchecked.empty())
    warn("ipex_flash: could not check the build of " + joined_kernels(program) +
         " in a child process (" + unchecked + "); building it in this process");
  if (!verdict.builds)
    // The reason the policies give for it (kBuildRefused, in python -m ipex_flash plan too).
    warn("ipex_flash: on " + device_description(device) + ", " + kBuildRefused + ": " +
         joined_kernels(program) + ": " + verdict.reason +
         ". These calls run the vector kernels instead.");
  return verdict.builds;
}

int probe_build(int device_index, const KernelProgram& program) {
  const char* crash = std::getenv("IPEX_FLASH_TEST_CRASH_BUILD");
  if (crash != nullptr && *crash != '\0' &&
      joined_kernels(program).find(crash) != std::string::npos)
    raise(SIGSEGV);
  const std::vector<sycl::device> devices = sycl::device::get_devices();
  if (device_index < 0 || device_index >= static_cast<int>(devices.size())) {
    std::cerr << "ipex_flash: no device " << device_index << " in this process" << std::endl;
    return kProbeNoDevice;
  }
  try {
    sycl::queue queue{devices[device_index], sycl::property::queue::in_order{}};
    get_kernels(queue, program);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return kProbeBuildFailed;
  }
}

}  // namespace ipex_flash
