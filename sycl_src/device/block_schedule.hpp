// Which (batch, head, block) a work-group owns. Work-groups are numbered block-fastest so
// that neighbours share K/V (or Q) in cache.
#pragma once

#include <cstdint>

namespace ipex_flash {

struct BlockCoord {
  int batch;
  int head;
  int block;
};

// reverse_blocks: under a causal mask the blocks at one end do the most work; numbering them
// first lets the launch end on short work-groups instead of waiting for one long one.
inline BlockCoord block_coord(int64_t group, int num_blocks, int heads, bool reverse_blocks) {
  const int64_t batch_head = group / num_blocks;
  const int block = static_cast<int>(group % num_blocks);
  return BlockCoord{static_cast<int>(batch_head / heads), static_cast<int>(batch_head % heads),
                    reverse_blocks ? num_blocks - 1 - block : block};
}

}  // namespace ipex_flash
