"""The register kernels' split of their blocks (run_blocks, score/block_mask.hpp): the lean
loop takes exactly the blocks block_fully_visible accepts, the general loops all others, and
every block is visited once, in order (the online softmax's results depend on it). The mask
arithmetic is plain C++: compiled for the host and checked over every shape of a grid of
lengths, diagonals, windows and block sizes, forward (key blocks of a query block) and dK/dV
(query blocks of a key block, whole ones only). The kernels' results under the split: test_matrix_path.py and
test_matrix_backward.py."""
import shutil
import subprocess
from pathlib import Path

import pytest

DEVICE_SOURCES = Path(__file__).resolve().parents[2] / "sycl_src" / "device"
CXX = shutil.which("g++") or shutil.which("clang++")

CHECK = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "score/block_mask.hpp"
using namespace ipex_flash;

// Visits the blocks of [first, end) as run_blocks does; fails unless the lean ones are
// exactly those `visible` accepts and the order is the grid's.
template <typename Visible>
static long walk(int64_t first, int64_t end, int size, BlockRun lean, Visible visible) {
  std::vector<int64_t> seen;
  long leans = 0;
  run_blocks<true>(first, end, size, lean, [&](auto general, int64_t start) {
    if (decltype(general)::value == visible(start)) {
      std::printf("block %ld: %s\n", (long)start, visible(start) ? "general" : "lean");
      std::exit(1);
    }
    leans += !decltype(general)::value;
    seen.push_back(start);
  });
  std::vector<int64_t> grid;
  for (int64_t start = first; start < end; start += size) grid.push_back(start);
  if (seen != grid) {
    std::printf("order\n");
    std::exit(1);
  }
  return leans;
}

int main() {
  long walks = 0, leans = 0;
  for (int len_q = 1; len_q <= 70; len_q += 3)
  for (int len_k = 1; len_k <= 70; len_k += 3)
  for (int diag = -40; diag <= 40; diag += 7)
  for (int left = -1; left <= 45; left += 6)
  for (int right = -1; right <= 45; right += 6)
  for (int size : {4, 8, 16}) {
    const BlockMask mask{diag, left, right, len_k};
    for (int64_t q = 0; q < len_q; q += size + 3) {  // forward, dQ: a query block's keys
      const int64_t q_end = std::min<int64_t>(q + size + 3, len_q);
      const int64_t first = mask.first_key(q) / size * size, end = mask.end_key(q_end);
      leans += walk(first, end, size,
                    mask.fully_visible_key_blocks(q, q_end, first, end, size),
                    [&](int64_t k) { return mask.block_fully_visible(q, q_end, k, k + size); });
      ++walks;
    }
    for (int64_t k = 0; k < len_k; k += size) {  // dK/dV: a key block's query blocks
      const int64_t k_end = std::min<int64_t>(k + size, len_k);
      const int rows = 2 * size;
      const int64_t first = mask.first_row(k) / rows * rows, end = mask.end_row(k_end, len_q);
      leans += walk(first, end, rows,
                    mask.fully_visible_row_blocks(k, k + size, first, end, rows, len_q),
                    [&](int64_t q) {  // whole blocks only: the lean form's rows are constant
                      return q + rows <= len_q &&
                             mask.block_fully_visible(q, q + rows, k, k + size);
                    });
      ++walks;
    }
  }
  std::printf("%ld walks, %ld lean blocks\n", walks, leans);
}
"""


@pytest.mark.skipif(not DEVICE_SOURCES.is_dir(), reason="needs the checkout's sycl_src/device")
@pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")
def test_lean_runs_are_the_fully_visible_blocks(tmp_path):
    source = tmp_path / "runs.cpp"
    source.write_text(CHECK)
    binary = tmp_path / "runs"
    subprocess.run([CXX, "-std=c++17", "-O1", f"-I{DEVICE_SOURCES}", str(source), "-o",
                    str(binary)], check=True, capture_output=True, text=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout
    walks, _, leans = result.stdout.split()[:3]
    assert int(walks) > 10**6 and int(leans) > 10**6, result.stdout
