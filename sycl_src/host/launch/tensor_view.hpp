// A torch tensor as the host code sees it: a data pointer, a dtype name, sizes and strides in
// elements. The host module needs no libtorch headers; Python builds these from tensors.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/common/params.hpp"

namespace ipex_flash {

struct TensorView {
  std::uintptr_t data;           // tensor.data_ptr()
  std::string dtype;             // "float32", "float16" or "bfloat16"
  std::vector<int64_t> sizes;    // tensor.shape
  std::vector<int64_t> strides;  // tensor.stride(), in elements

  int64_t size(int dim) const { return sizes.at(dim < 0 ? dim + sizes.size() : dim); }
};

// Strides of a (B, H, N, D) view whose last dimension is contiguous.
inline BhndStrides bhnd_strides(const TensorView& t, const char* name) {
  if (t.sizes.size() != 4 || t.strides.size() != 4)
    throw std::invalid_argument(std::string("ipex_flash: ") + name + " must be 4-D (B, H, N, D)");
  if (t.strides[3] != 1 && t.sizes[3] > 1)
    throw std::invalid_argument(std::string("ipex_flash: ") + name +
                                " must have a contiguous last dimension");
  return BhndStrides{t.strides[0], t.strides[1], t.strides[2]};
}

}  // namespace ipex_flash
