"""Cutting a batch into the shards the distributed functions take, and putting results back
together: contiguous (ring_flash_attn_func, ulysses_flash_attn_func), zigzag
(zigzag_ring_flash_attn_func), stripe (stripe_flash_attn_func) and packed sequences
(ring_flash_attn_varlen_func; zigzag_ring_flash_attn_varlen_func's zigzag per sequence). Pure
tensor indexing, no communication: shard what every rank holds whole (a batch from one
seeded loader), and unshard what an all_gather returns.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ipex_flash.distributed._blocks import zigzag_bounds

Tensor = torch.Tensor


def _check(fn: str, x: Tensor, rank: int, world_size: int, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ValueError(f"{fn}: world_size must be an int >= 1, got {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"{fn}: rank must be in [0, {world_size}), got {rank!r}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{fn}: dim {dim} is out of range for x of shape {tuple(x.shape)}")
    return dim % x.dim()


def contiguous_shard(x: Tensor, rank: int, world_size: int, dim: int = 1) -> Tensor:
    """Rank `rank`'s consecutive slice of x along dim (the sequence dimension of (batch,
    seqlen, nheads, headdim)): tokens [rank * N // P, (rank + 1) * N // P)."""
    dim = _check("ipex_flash.distributed.contiguous_shard", x, rank, world_size, dim)
    n = x.shape[dim]
    start, stop = rank * n // world_size, (rank + 1) * n // world_size
    return x.narrow(dim, start, stop - start)


def contiguous_unshard(shards: Sequence[Tensor], dim: int = 1) -> Tensor:
    """The whole tensor from every rank's contiguous shard, in rank order."""
    return torch.cat(list(shards), dim=dim)


def zigzag_shard(x: Tensor, rank: int, world_size: int, dim: int = 1) -> Tensor:
    """Rank `rank`'s zigzag shard of x along dim: of 2P chunks (lengths differing by at most
    one), chunks rank and 2P-1-rank, concatenated in that order (a copy)."""
    dim = _check("ipex_flash.distributed.zigzag_shard", x, rank, world_size, dim)
    bounds = zigzag_bounds(x.shape[dim], world_size)
    head, tail = rank, 2 * world_size - 1 - rank
    return torch.cat([x.narrow(dim, bounds[c], bounds[c + 1] - bounds[c]) for c in (head, tail)],
                     dim=dim)


def zigzag_unshard(shards: Sequence[Tensor], dim: int = 1) -> Tensor:
    """The whole tensor from every rank's zigzag shard, in rank order (e.g. the list an
    all_gather fills)."""
    shards = list(shards)
    world = len(shards)
    if world == 0:
        raise ValueError("ipex_flash.distributed.zigzag_unshard: shards is empty")
    total = sum(s.shape[dim] for s in shards)
    bounds = zigzag_bounds(total, world)
    size = lambda c: bounds[c + 1] - bounds[c]  # noqa: E731
    chunks = [None] * (2 * world)
    for rank, shard in enumerate(shards):
        head, tail = rank, 2 * world - 1 - rank
        if shard.shape[dim] != size(head) + size(tail):
            raise ValueError(
                f"ipex_flash.distributed.zigzag_unshard: shard {rank} has {shard.shape[dim]} "
                f"tokens, zigzag_shard of {total} tokens gives it {size(head) + size(tail)}")
        chunks[head] = shard.narrow(dim, 0, size(head))
        chunks[tail] = shard.narrow(dim, size(head), size(tail))
    return torch.cat(chunks, dim=dim)


def _check_cu(fn: str, cu_seqlens: Tensor, world_size: int) -> list[int]:
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        raise TypeError(f"{fn}: cu_seqlens must be a 1-D tensor of offsets")
    offsets = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(offsets, offsets[1:])]
    uneven = [n for n in lengths if n % world_size]
    if uneven:
        raise ValueError(
            f"{fn}: every sequence's length must be a multiple of world_size={world_size} "
            f"(each rank holds an equal slice of each), got lengths {lengths}")
    return offsets


def varlen_shard(x: Tensor, cu_seqlens: Tensor, rank: int, world_size: int
                 ) -> tuple[Tensor, Tensor, int]:
    """Rank `rank`'s slice of every packed sequence of x (total, ...), for
    ring_flash_attn_varlen_func: returns (x_local, cu_seqlens_local int32, max_seqlen_local).
    Each sequence's length must be a multiple of world_size."""
    fn = "ipex_flash.distributed.varlen_shard"
    _check(fn, x, rank, world_size, 0)
    offsets = _check_cu(fn, cu_seqlens, world_size)
    pieces = []
    for start, stop in zip(offsets, offsets[1:]):
        part = (stop - start) // world_size
        pieces.append(x[start + rank * part:start + (rank + 1) * part])
    local_cu = (cu_seqlens // world_size).to(torch.int32)
    lengths = [(b - a) // world_size for a, b in zip(offsets, offsets[1:])]
    return torch.cat(pieces), local_cu, max(lengths, default=0)


def varlen_unshard(shards: Sequence[Tensor], cu_seqlens: Tensor) -> Tensor:
    """The packed whole (total, ...) from every rank's varlen_shard, in rank order;
    cu_seqlens: the whole batch's offsets."""
    shards = list(shards)
    offsets = _check_cu("ipex_flash.distributed.varlen_unshard", cu_seqlens, len(shards))
    world = len(shards)
    pieces = []
    for a, b in zip(offsets, offsets[1:]):
        part = (b - a) // world
        local = a // world
        pieces += [shard[local:local + part] for shard in shards]
    return torch.cat(pieces)


def stripe_shard(x: Tensor, rank: int, world_size: int, dim: int = 1) -> Tensor:
    """Rank `rank`'s stripe shard of x along dim, for stripe_flash_attn_func: tokens rank,
    rank + P, rank + 2P, ... (a copy)."""
    dim = _check("ipex_flash.distributed.stripe_shard", x, rank, world_size, dim)
    index = torch.arange(rank, x.shape[dim], world_size, device=x.device)
    return x.index_select(dim, index)


def stripe_unshard(shards: Sequence[Tensor], dim: int = 1) -> Tensor:
    """The whole tensor from every rank's stripe shard, in rank order: token t from shard
    t mod P."""
    shards = list(shards)
    world = len(shards)
    if world == 0:
        raise ValueError("ipex_flash.distributed.stripe_unshard: shards is empty")
    total = sum(s.shape[dim] for s in shards)
    for rank, shard in enumerate(shards):
        want = (total - rank + world - 1) // world
        if shard.shape[dim] != want:
            raise ValueError(
                f"ipex_flash.distributed.stripe_unshard: shard {rank} has {shard.shape[dim]} "
                f"tokens, stripe_shard of {total} tokens gives it {want}")
    order = torch.cat([torch.arange(r, total, world) for r in range(world)])
    whole = torch.cat(shards, dim=dim)
    return whole.index_select(dim, torch.argsort(order).to(whole.device))


def _zigzag_varlen_offsets(fn: str, cu_seqlens: Tensor, world_size: int) -> list[int]:
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        raise TypeError(f"{fn}: cu_seqlens must be a 1-D tensor of offsets")
    offsets = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(offsets, offsets[1:])]
    if any(n % (2 * world_size) for n in lengths):
        raise ValueError(
            f"{fn}: every sequence's length must be a multiple of 2 * world_size = "
            f"{2 * world_size} (each rank holds two equal chunks of each), got lengths "
            f"{lengths}")
    return offsets


def zigzag_varlen_shard(x: Tensor, cu_seqlens: Tensor, rank: int, world_size: int
                        ) -> tuple[Tensor, Tensor, int]:
    """Rank `rank`'s zigzag shard of every packed sequence of x (total, ...), for
    zigzag_ring_flash_attn_varlen_func: each sequence cut into 2P equal chunks, chunks rank
    and 2P-1-rank of it, sequence after sequence. Returns (x_local, cu_seqlens_local int32
    = cu_seqlens // P, max_seqlen_local). Each length must be a multiple of 2P."""
    fn = "ipex_flash.distributed.zigzag_varlen_shard"
    _check(fn, x, rank, world_size, 0)
    offsets = _zigzag_varlen_offsets(fn, cu_seqlens, world_size)
    pieces = []
    for start, stop in zip(offsets, offsets[1:]):
        chunk = (stop - start) // (2 * world_size)
        for c in (rank, 2 * world_size - 1 - rank):
            pieces.append(x[start + c * chunk:start + (c + 1) * chunk])
    lengths = [(b - a) // world_size for a, b in zip(offsets, offsets[1:])]
    local_cu = torch.div(cu_seqlens, world_size, rounding_mode="floor").to(torch.int32)
    return torch.cat(pieces), local_cu, max(lengths, default=0)


def zigzag_varlen_unshard(shards: Sequence[Tensor], cu_seqlens: Tensor) -> Tensor:
    """The packed whole (total, ...) from every rank's zigzag_varlen_shard, in rank order;
    cu_seqlens: the whole batch's offsets."""
    shards = list(shards)
    world = len(shards)
    offsets = _zigzag_varlen_offsets("ipex_flash.distributed.zigzag_varlen_unshard",
                                     cu_seqlens, world)
    pieces = []
    for a, b in zip(offsets, offsets[1:]):
        chunk = (b - a) // (2 * world)
        local = a // world
        chunks = [None] * (2 * world)
        for rank, shard in enumerate(shards):
            chunks[rank] = shard[local:local + chunk]
            chunks[2 * world - 1 - rank] = shard[local + chunk:local + 2 * chunk]
        pieces += chunks
    return torch.cat(pieces)
