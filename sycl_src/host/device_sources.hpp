// The device headers of sycl_src/device/, embedded in the module at build time.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ipex_flash {

// (file name, file text) for every device header.
const std::vector<std::pair<std::string, std::string>>& device_sources();

}  // namespace ipex_flash
