// Where each sequence's blocks sit in the matrix kernels' packs (forward/pack_kv.hpp,
// backward/pack_operands.hpp), which both the pack kernels and the kernels reading them address
// through here. Packs are sized by the real sequences, not batch x the longest: sequence b, rows
// [cu[b], cu[b + 1]) of the packed batch, starts at block (cu[b] + b (BLOCK - 1)) / BLOCK.
// Successive starts differ by at least ceil(len_b / BLOCK), since floor(x + y) >= floor(x) +
// floor(y), so sequences never share a block; the pack holds (total + B (BLOCK - 1)) / BLOCK
// blocks per head, at most total / BLOCK + B, which the host knows from the packed tensor's
// length without reading cu. A gap block (at most one per sequence) is written as zeros and
// never read.
#pragma once

#include <cstdint>

#include "common/params.hpp"
#include "common/powers_of_two.hpp"

namespace ipex_flash {

// Whether the backward's packs (backward/pack_operands.hpp) are tile by tile for tiles N columns
// wide: on the 8-wide engines (N = 8), which have no 2-D block loads, up to head dim 128. Past
// 128 the SLM-staged kernels reading tiles spilled more than row by row on DG2 (dQ at d = 192),
// and the pack's staging spilled too (gpu-check's record). The host names the pack kernels by
// it, the kernels reading the packs address them by it.
constexpr bool bwd_pack_tiled(int head_dim, int matrix_n) {
  return matrix_n == 8 && head_dim <= 128;
}

// Where a tiled backward pack starts, in bytes: at a multiple of its larger tile (K's BLOCK_N x
// d, a query block's BLOCK_M x d, 16-bit) where both tiles are powers of two in bytes (d = 64,
// 128), so that every tile does (the key region rounded up to whole row tiles: PackedBwd), and
// the register kernels address a tile as its start OR its offset (MatrixSurface's OR_OFFSETS:
// one instruction where the 8-wide engines emulate a 64-bit add in about five). 1 otherwise.
constexpr int64_t bwd_pack_alignment(int head_dim, int matrix_n, int block_m, int block_n) {
  const int64_t key_tile = int64_t{2} * block_n * head_dim;
  const int64_t row_tile = int64_t{2} * block_m * head_dim;
  if (!bwd_pack_tiled(head_dim, matrix_n) || !power_of_two(key_tile) || !power_of_two(row_tile))
    return 1;
  return key_tile > row_tile ? key_tile : row_tile;
}

// Where the forward's packed K/V copy starts, in bytes, for the register forward (REGISTERS)
// reading it tile by tile (matrix_n 8: the 8-wide engines and their emulation): at a multiple
// of a block's bytes (K and V^T of block_n keys, 16-bit) where that is a power of two, so
// that every block does, as its OR-addressed tiles need (forward/registers_kernel.hpp). 1
// otherwise.
constexpr int64_t fwd_pack_alignment(int head_dim, int head_dim_v, int block_n, int matrix_n,
                                     bool registers) {
  const int64_t block = int64_t{2} * block_n * (head_dim + head_dim_v);
  return registers && matrix_n != 16 && power_of_two(block) ? block : 1;
}

// First block of a sequence preceded by `rows_before` rows in `sequence` sequences.
inline int64_t blocks_before(int64_t rows_before, int64_t sequence, int block) {
  return (rows_before + sequence * (block - 1)) / block;
}

// Blocks per head of a pack of `batch` sequences: with cu_rows, `total_rows` of them (their
// last prefix sum, or any larger bound); fixed length: seq_blocks each.
inline PackRows pack_rows(const int32_t* cu_rows, int64_t total_rows, int batch,
                          int64_t seq_blocks, int block) {
  const int64_t blocks = cu_rows != nullptr ? blocks_before(total_rows, batch, block)
                                            : batch * seq_blocks;
  return PackRows{cu_rows, static_cast<int32_t>(seq_blocks), static_cast<int32_t>(blocks)};
}

template <int BLOCK>
inline int64_t pack_first_block(const PackRows& pack, int batch) {
  return pack.cu_rows != nullptr ? blocks_before(pack.cu_rows[batch], batch, BLOCK)
                                 : static_cast<int64_t>(batch) * pack.seq_blocks;
}

// Index of block `block` of sequence `batch`, head `head`, among the pack's blocks.
template <int BLOCK>
inline int64_t pack_block_index(const PackRows& pack, int batch, int head, int64_t block) {
  return static_cast<int64_t>(head) * pack.blocks + pack_first_block<BLOCK>(pack, batch) + block;
}

// The block a pack kernel's work-group writes: work-groups run over every block of every head
// (head-major), each finds its sequence, the last whose first block is at or before it (a
// binary search over the starts: empty sequences start where the next one does).
struct PackedBlock {
  int batch;
  int head;
  int64_t block;  // within the sequence; past its end in a gap block
};

template <int BLOCK>
inline PackedBlock packed_block(const PackRows& pack, int batch_size, int64_t group) {
  const int head = static_cast<int>(group / pack.blocks);
  const int64_t index = group % pack.blocks;
  int lo = 0, hi = batch_size - 1;
  if (pack.cu_rows == nullptr) {
    lo = static_cast<int>(index / pack.seq_blocks);
  } else {
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (pack_first_block<BLOCK>(pack, mid) <= index) lo = mid; else hi = mid - 1;
    }
  }
  return PackedBlock{lo, head, index - pack_first_block<BLOCK>(pack, lo)};
}

}  // namespace ipex_flash
