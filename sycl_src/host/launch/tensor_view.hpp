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

// Bytes of one element of a view's dtype: float32, a 16-bit type, an FP8 one, or bool (masks).
inline int64_t element_bytes(const std::string& dtype) {
  return dtype == "float32" ? 4 : dtype == "bool" || dtype.rfind("float8", 0) == 0 ? 1 : 2;
}

// Whether two views of one dtype may share an element (addresses: data pointers, or offsets in
// one storage). Their byte spans meet, and they are not column ranges that miss each other in
// the same rows: views of equal sizes and strides but the last, contiguous one, on rows a
// common stride apart. MLA's one latent cache, passed as k_cache and a view of its first
// columns as v_cache, overlaps; K and V as halves of each row, or as the two halves of one
// (2, ...) tensor (vLLM's layout), do not. Negative strides count as overlapping.
inline bool views_overlap(const TensorView& a, const TensorView& b) {
  const auto span = [](const TensorView& t, int64_t& first, int64_t& end) {
    int64_t last = 0;
    for (size_t d = 0; d < t.sizes.size(); ++d) {
      if (t.sizes[d] == 0) return false;  // empty: no element
      if (t.strides[d] < 0) return true;
      last += (t.sizes[d] - 1) * t.strides[d];
    }
    first = static_cast<int64_t>(t.data);
    end = first + (last + 1) * element_bytes(t.dtype);
    return true;
  };
  int64_t a_first = 0, a_end = 0, b_first = 0, b_end = 0;
  if (!span(a, a_first, a_end) || !span(b, b_first, b_end)) return false;
  if (a_end <= b_first || b_end <= a_first) return false;
  const size_t n = a.sizes.size();
  if (n == 0 || b.sizes.size() != n || a.dtype != b.dtype || a.strides[n - 1] != 1 ||
      b.strides[n - 1] != 1)
    return true;
  int64_t row = 0;  // the rows' common stride: the smallest of the other dims'
  for (size_t d = 0; d + 1 < n; ++d) {
    if (a.sizes[d] != b.sizes[d] || a.strides[d] != b.strides[d] || a.strides[d] < 0) return true;
    if (a.sizes[d] > 1 && (row == 0 || a.strides[d] < row)) row = a.strides[d];
  }
  if (row == 0) return true;
  for (size_t d = 0; d + 1 < n; ++d)
    if (a.sizes[d] > 1 && a.strides[d] % row != 0) return true;
  const int64_t element = element_bytes(a.dtype), apart = b_first - a_first;
  if (apart % element != 0) return true;
  const int64_t shift = ((apart / element) % row + row) % row;  // b's first column in a's rows
  if (a.sizes[n - 1] > row || shift + b.sizes[n - 1] > row) return true;
  return shift < a.sizes[n - 1];  // columns [0, a's) and [shift, shift + b's) of a row
}

}  // namespace ipex_flash
