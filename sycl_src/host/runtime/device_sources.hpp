// The device headers of sycl_src/device/, embedded in the module at build time.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ipex_flash {

// (path from sycl_src/device, file text) for every device header.
const std::vector<std::pair<std::string, std::string>>& device_sources();

// FNV-1a of `text`, continuing from `hash`: the same value in every process and build, so it
// can name things kept on disk.
uint64_t fnv1a(const std::string& text, uint64_t hash = 1469598103934665603ull);

// The device sources' hash (names and texts, overrides included): what on-disk records of a
// build (the build guard's verdicts, gpu-check's SPIR-V) are kept for.
uint64_t device_sources_hash();

}  // namespace ipex_flash
