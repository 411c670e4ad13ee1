// A torch tensor as the host code sees it: a data pointer, a dtype name, sizes and strides in
// elements. The host module needs no libtorch headers; Python builds these from tensors.
#pragma once

#include <cstdint>
#include <cstdlib>
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

// Bytes of one element of a view's dtype: float32, a 16-bit type, an FP8 one, or bool (masks).
inline int64_t element_bytes(const std::string& dtype) {
  return dtype == "float32" ? 4 : dtype == "bool" || dtype.rfind("float8", 0) == 0 ? 1 : 2;
}

// Whether the same row of two views (equal indices but the last) shares memory: what an append
// into k_cache and v_cache would write twice. Addresses are data pointers, or offsets in one
// storage. MLA's one latent cache, passed as k_cache and a view of its first columns as
// v_cache, shares every row. K and V as halves of each row, the two halves of one (2, ...)
// tensor (vLLM's layout) and views of one buffer a page apart (transformers' paged cache, where
// the block table keeps the pages each cache writes apart) do not.
inline bool rows_overlap(const TensorView& a, const TensorView& b) {
  const size_t n = a.sizes.size();
  if (n == 0 || b.sizes.size() != n) return a.data == b.data;
  for (size_t d = 0; d < n; ++d)
    if (a.sizes[d] == 0 || b.sizes[d] == 0) return false;  // empty: no element
  const int64_t a_bytes = element_bytes(a.dtype), b_bytes = element_bytes(b.dtype);
  const auto row_bytes = [n](const TensorView& t, int64_t element) {
    return ((t.sizes[n - 1] - 1) * std::abs(t.strides[n - 1]) + 1) * element;
  };
  // With equal other strides, rows i of a and b are as far apart as their first rows; with
  // different ones (no engine's layout) the first rows stand for them.
  const int64_t apart = static_cast<int64_t>(b.data) - static_cast<int64_t>(a.data);
  return -row_bytes(b, b_bytes) < apart && apart < row_bytes(a, a_bytes);
}

}  // namespace ipex_flash
