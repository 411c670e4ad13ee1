"""Where each rank's queries and the keys they need sit when a packed batch's token stream is
cut into equal contiguous slices, one per rank (llama3_flash_attn_varlen_func's layout, in
llama3.py): ring-flash-attention's llama3_flash_attn_prepare_cu_seqlens."""
from __future__ import annotations

import bisect

import torch

Tensor = torch.Tensor


def llama3_flash_attn_prepare_cu_seqlens(cu_seqlens: Tensor, causal: bool, rank: int,
                                         world_size: int):
    """This rank's view of a packed batch whose token stream is split into world_size equal
    contiguous slices.

    Args:
        cu_seqlens: (batch + 1,) the offsets of every sequence in the whole packed stream;
            cu_seqlens[-1] must be a multiple of world_size (pad the stream).
        causal: as the attention call will be: with causal the keys stop at the end of this
            rank's slice, without they run to the end of its last sequence.

    Returns:
        (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, local_k_slice): offsets of
        this rank's query tokens, cut into the sequences they belong to; offsets of the keys
        those queries need, within local_k_slice (a slice of the all-gathered stream, which
        may be longer than total / world_size); the longest of each as Python ints.
    """
    fn = "ipex_flash.distributed.llama3_flash_attn_prepare_cu_seqlens"
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or len(cu_seqlens) < 2:
        raise ValueError(f"{fn}: cu_seqlens must be a 1-D tensor (batch + 1,)")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"{fn}: world_size must be an int >= 1, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"{fn}: rank must be an int in [0, {world_size}), got {rank!r}")
    offsets = cu_seqlens.tolist()  # one host read per batch, not per layer
    if offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"{fn}: cu_seqlens must start at 0 and never decrease, got {offsets}")
    total = offsets[-1]
    if total % world_size:
        raise ValueError(f"{fn}: cu_seqlens[-1] = {total} tokens must be a multiple of "
                         f"world_size = {world_size} (pad the packed batch)")
    if total == 0:
        raise ValueError(f"{fn}: cu_seqlens describes no tokens")
    per_rank = total // world_size
    start, end = rank * per_rank, (rank + 1) * per_rank
    # The sequences that overlap [start, end): from the one holding `start` to the first
    # one that reaches `end`.
    first = bisect.bisect_left(offsets, start)
    if offsets[first] != start:
        first -= 1
    bounds = offsets[first:bisect.bisect_left(offsets, end) + 1]
    q_bounds = [min(max(b - start, 0), per_rank) for b in bounds]
    k_right = end if causal else bounds[-1]
    k_bounds = [min(b, k_right) - bounds[0] for b in bounds]
    return (_offsets(q_bounds, cu_seqlens), _offsets(k_bounds, cu_seqlens), _longest(q_bounds),
            _longest(k_bounds), slice(bounds[0], k_right))


def _offsets(bounds: list[int], like: Tensor) -> Tensor:
    return torch.tensor(bounds, dtype=like.dtype, device=like.device)


def _longest(bounds: list[int]) -> int:
    return max(b - a for a, b in zip(bounds, bounds[1:]))
