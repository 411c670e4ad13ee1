// Which (batch, head, block) a work-group owns. Work-groups are numbered block-fastest so
// that neighbours share K/V (or Q) in cache.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/params.hpp"
#include "common/seq_info.hpp"

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

// The query block of a work-group of the forward and dQ kernels (one work-group per batch,
// query head and block of BLOCK_M rows, highest blocks first: under a causal mask they are the
// longest). `empty` when the block starts past its sequence's end (variable length), which
// every work-item of the group sees alike, so the group may leave before any barrier.
struct QueryBlock {
  int batch;
  int head;
  int head_kv;
  int64_t batch_head;  // batch * Hq + head: dropout counters and row statistics
  SeqInfo seq;
  int64_t begin;       // first row of the block within the sequence
  int64_t end;         // one past its last row (clipped to the sequence)
  bool empty;
};

inline QueryBlock query_block(const AttentionCommon& c, int64_t group, int block_m) {
  const BlockCoord coord = block_coord(group, c.num_blocks, c.dims.heads_q, /*reverse_blocks=*/true);
  QueryBlock q{coord.batch, coord.head, coord.head / c.dims.heads_per_kv,
               static_cast<int64_t>(coord.batch) * c.dims.heads_q + coord.head,
               seq_info(c, coord.batch), static_cast<int64_t>(coord.block) * block_m, 0, false};
  q.empty = q.begin >= q.seq.len_q;
  q.end = std::min<int64_t>(q.begin + block_m, q.seq.len_q);
  return q;
}

}  // namespace ipex_flash
