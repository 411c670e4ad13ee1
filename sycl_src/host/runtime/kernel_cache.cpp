#include "host/runtime/kernel_cache.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "host/runtime/build_lock.hpp"
#include "host/runtime/device_queue.hpp"
#include "host/runtime/device_sources.hpp"

namespace ipex_flash {
namespace {

namespace syclex = sycl::ext::oneapi::experimental;

struct CacheKey {
  sycl::context context;
  sycl::device device;
  std::string kernel_names;  // header, names and build options, joined
  bool operator==(const CacheKey& o) const {
    return context == o.context && device == o.device && kernel_names == o.kernel_names;
  }
};

struct CacheKeyHash {
  size_t operator()(const CacheKey& key) const {
    size_t h = std::hash<sycl::context>{}(key.context);
    h = h * 31 + std::hash<sycl::device>{}(key.device);
    return h * 31 + std::hash<std::string>{}(key.kernel_names);
  }
};

struct KernelCache {
  std::mutex mutex;
  std::unordered_map<CacheKey, std::vector<sycl::kernel>, CacheKeyHash> kernels;
  KernelCacheStats stats{0, 0};
};

KernelCache& cache() {
  // Never destroyed, like the queue: its kernels must not outlive the SYCL runtime.
  static KernelCache* instance = new KernelCache();
  return *instance;
}

// A build that took this long compiled (rather than loaded from the persistent cache); worth
// one line on stderr so a user knows why the first call was slow.
constexpr double kReportBuildSeconds = 1.0;

std::atomic<bool> warmup_mode{false};

// The device headers are handed to the kernel compiler as virtual files under one root that
// exists on no real file system, and that root is the include path: a header in any folder
// names another by its path from the root ("common/params.hpp"), and a file of the user's
// working directory can never stand in for one of ours.
constexpr const char* kDeviceSourceRoot = "/ipex_flash_device_sources";

sycl::kernel_bundle<sycl::bundle_state::ext_oneapi_source> source_bundle(
    sycl::queue& queue, const KernelProgram& program) {
  syclex::include_files includes;
  for (const auto& [name, text] : device_sources())
    includes.add(std::string(kDeviceSourceRoot) + "/" + name, text);
  const std::string source = "#include \"" + program.header + "\"\n";
  return syclex::create_kernel_bundle_from_source(
      queue.get_context(), syclex::source_language::sycl, source, syclex::properties{includes});
}

// The program's build options with the device sources' root as the include path.
std::vector<std::string> build_options(const KernelProgram& program) {
  std::vector<std::string> options = program.options;
  options.push_back(std::string("-I") + kDeviceSourceRoot);
  return options;
}

sycl::kernel_bundle<sycl::bundle_state::executable> compile_bundle(sycl::queue& queue,
                                                                   const KernelProgram& program,
                                                                   std::string& log) {
  auto source = source_bundle(queue, program);
  return syclex::build(
      source, std::vector<sycl::device>{queue.get_device()},
      syclex::properties{syclex::build_options{build_options(program)},
                         syclex::registered_names{program.kernels}, syclex::save_log{&log}});
}

std::string joined_names(const KernelProgram& program) {
  std::string joined;
  for (const std::string& name : program.kernels) joined += (joined.empty() ? "" : ", ") + name;
  return joined;
}

std::runtime_error build_error(sycl::queue& queue, const KernelProgram& program,
                               const sycl::exception& e, const std::string& log) {
  return std::runtime_error("ipex_flash: building SYCL kernel " + joined_names(program) +
                            " for " + device_description(queue.get_device()) + " failed: " +
                            e.what() + (log.empty() ? std::string() : "\nbuild log:\n" + log));
}

std::vector<sycl::kernel> build_kernels(sycl::queue& queue, const KernelProgram& program) {
  std::string log;
  const auto start = std::chrono::steady_clock::now();
  try {
    auto bundle = compile_bundle(queue, program, log);
    std::vector<sycl::kernel> kernels;
    for (const std::string& name : program.kernels) kernels.push_back(bundle.ext_oneapi_get_kernel(name));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > kReportBuildSeconds && warmup_mode.load()) {
      // A compile from source stores the device binary under a key that a later process,
      // which starts from the cached IR, does not look up: that process would spend ~0.5 s
      // rebuilding from the IR. Building once more here goes the later processes' way and
      // stores the binary they will find.
      std::string unused_log;
      compile_bundle(queue, program, unused_log);
    }
    if (seconds > kReportBuildSeconds && std::getenv("IPEX_FLASH_QUIET") == nullptr) {
      std::fprintf(stderr,
                   "ipex_flash: compiled %s for %s in %.1f s (first use; kept in the "
                   "persistent kernel cache for later runs)\n",
                   joined_names(program).c_str(), device_description(queue.get_device()).c_str(),
                   seconds);
    }
    return kernels;
  } catch (const sycl::exception& e) {
    throw build_error(queue, program, e, log);
  }
}

}  // namespace

std::vector<sycl::kernel> get_kernels(sycl::queue& queue, const KernelProgram& program) {
  KernelCache& c = cache();
  std::string joined = program.header;
  for (const std::string& name : program.kernels) joined += "|" + name;
  for (const std::string& option : program.options) joined += " " + option;
  CacheKey key{queue.get_context(), queue.get_device(), joined};
  // Held across the build: concurrent first calls of one variant build it once.
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.kernels.find(key);
  if (it != c.kernels.end()) {
    ++c.stats.hits;
    return it->second;
  }
  // Another process building the same program (a rank beside this one) is waited for: its
  // build then fills the persistent cache this one loads from.
  ProgramBuildLock build_lock(queue.get_device(), joined);
  std::vector<sycl::kernel> kernels = build_kernels(queue, program);
  ++c.stats.builds;
  c.kernels.emplace(std::move(key), kernels);
  return kernels;
}

std::string compile_to_spirv(sycl::queue& queue, const KernelProgram& program) {
  std::string log;
  try {
    auto source = source_bundle(queue, program);
    syclex::compile(source, std::vector<sycl::device>{queue.get_device()},
                    syclex::properties{syclex::build_options{build_options(program)},
                                       syclex::registered_names{program.kernels},
                                       syclex::save_log{&log}});
  } catch (const sycl::exception& e) {
    throw build_error(queue, program, e, log);
  }
  return log;
}

void set_warmup_mode(bool on) { warmup_mode.store(on); }

KernelCacheStats kernel_cache_stats() {
  KernelCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

}  // namespace ipex_flash
