"""Hybrid sequence parallelism (USP, as yunchang's LongContextAttention): Ulysses inside a
group of U ranks, a ring across R such groups, P = U x R ranks in all. The Ulysses all-to-all
turns each rank's shard with all heads into its Ulysses group's whole shard with 1/U of the
heads; the ring (ring_flash_attn_func or zigzag_ring_flash_attn_func) then runs over the R
ranks that hold the same heads; the inverse all-to-all brings the output back.

    from ipex_flash.distributed.usp import LongContextAttention, usp_groups_from_mesh
    mesh = init_device_mesh("xpu", (R, U), mesh_dim_names=("ring", "ulysses"))
    attn = LongContextAttention(ring_impl_type="zigzag", mesh=mesh)
    out = attn(q, k, v, causal=True)          # q, k, v: usp_shard(x, ...) of each rank

The Ulysses part takes nheads a multiple of U and replicates K/V heads U does not divide;
the ring takes the rest of the options, dropout included (placed at the rank's heads).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ipex_flash.distributed._checks import AGREED, check_local, shape_signature
from ipex_flash.distributed._comm import resolve_group
from ipex_flash.distributed.ring import (
    _ring_attention, ring_flash_attn_func, zigzag_ring_flash_attn_func)
from ipex_flash.distributed.sharding import contiguous_shard, zigzag_shard
from ipex_flash.distributed.ulysses import (
    agreed_lengths, kv_repeats, lse_to_sequence_shard, to_head_shards, to_sequence_shard,
    ulysses_flash_attn_func)
from ipex_flash.ops.validation import check_alibi

Tensor = torch.Tensor
RING_IMPLS = {"basic": ring_flash_attn_func, "zigzag": zigzag_ring_flash_attn_func}
RING_KINDS = {"basic": "contiguous", "zigzag": "zigzag"}  # their layouts (ring.py)
# The groups set_seq_parallel_pg made for this process, as yunchang keeps them.
PROCESS_GROUPS = {"ulysses": None, "ring": None}


def _ring_fn(fn: str, ring_impl_type: str):
    if ring_impl_type not in RING_IMPLS:
        raise ValueError(f"{fn}: ring_impl_type must be one of {sorted(RING_IMPLS)}, got "
                         f"{ring_impl_type!r}")
    return RING_IMPLS[ring_impl_type]


def usp_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                        window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                        return_attn_probs=False, *, ulysses_group, ring_group,
                        ring_impl_type="basic", softcap=0.0, sinks=None):
    """Attention over a sequence sharded over ulysses_group x ring_group (usp_shard gives each
    rank its shard).

    Args:
        q: (batch, seqlen_local, nheads, headdim), nheads a multiple of the Ulysses group
            size; k, v: (batch, seqlen_local, nheads_k, headdim / headdim_v).
        ulysses_group, ring_group: this rank's two process groups: the ranks of a Ulysses
            group hold consecutive parts of one ring shard, the ranks of a ring the same
            Ulysses rank of each group (usp_groups_from_mesh and set_seq_parallel_pg make
            them so). None for either runs the other alone.
        ring_impl_type: "basic" (ring_flash_attn_func, contiguous shards) or "zigzag"
            (zigzag_ring_flash_attn_func, balanced causal work).
        dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic,
            softcap, sinks: as ring_flash_attn_func, in positions of the whole sequence.
            dropout keeps what one process's flash_attn_func keeps for the same seed (each
            ring call placed at its global heads and positions; seed every rank alike).
            sinks' gradient is this rank's part: sum it over both groups.
        return_attn_probs: also return the LSE (batch, nheads, seqlen_local), natural log,
            and None.

    Returns:
        out (batch, seqlen_local, nheads, headdim_v), or (out, lse, None).
    """
    fn = "ipex_flash.distributed.usp_flash_attn_func"
    ring = _ring_fn(fn, ring_impl_type)
    options = dict(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                   window_size=window_size, alibi_slopes=alibi_slopes,
                   deterministic=deterministic, return_attn_probs=return_attn_probs,
                   softcap=softcap, sinks=sinks)
    if ulysses_group is None and ring_group is None:
        raise ValueError(f"{fn}: give ulysses_group, ring_group or both")
    if ulysses_group is None:
        return ring(q, k, v, group=ring_group, **options)
    if ring_group is None:
        return ulysses_flash_attn_func(q, k, v, group=ulysses_group, **options)
    ulysses_group = resolve_group(fn, ulysses_group)
    ring_group = resolve_group(fn, ring_group)
    _, window = check_local(fn, q, k, v, dropout_p, softmax_scale, window_size, softcap,
                            None, sinks, packed=False, placed=True)
    # The ring places each block's ALiBi distances globally; each rank's heads take their
    # slopes.
    check_alibi(fn, alibi_slopes, q.shape[0], q.shape[2], q.device)
    world, rank = dist.get_world_size(ulysses_group), dist.get_rank(ulysses_group)
    repeats = kv_repeats(fn, q.shape[2], k.shape[2], world)
    lengths = agreed_lengths(fn, shape_signature(q, k, v, causal, window, softcap, sinks,
                                                 False, dropout_p), AGREED, q.device,
                             ulysses_group)
    heads = slice(rank * q.shape[2] // world, (rank + 1) * q.shape[2] // world)
    q_h, k_h, v_h = to_head_shards(q, k, v, lengths, repeats, ulysses_group)
    # The ring over this rank's heads, its calls placed at their first head among all of
    # them: dropout draws the keep-mask of one process's call (one seed, drawn by the ring).
    result = _ring_attention(
        fn, RING_KINDS[ring_impl_type], q_h, k_h, v_h, dropout_p, softmax_scale, causal,
        window, softcap, None if alibi_slopes is None else alibi_slopes[..., heads].contiguous(),
        return_attn_probs, ring_group, None if sinks is None else sinks[heads],
        heads=(heads.start, q.shape[2]))
    if not return_attn_probs:
        return to_sequence_shard(result, lengths, ulysses_group)
    out_h, lse_h, _ = result
    return (to_sequence_shard(out_h, lengths, ulysses_group),
            lse_to_sequence_shard(lse_h, lengths, ulysses_group), None)


def usp_shard(x: Tensor, ulysses_rank: int, ulysses_size: int, ring_rank: int, ring_size: int,
              ring_impl_type: str = "basic", dim: int = 1) -> Tensor:
    """A rank's shard of x along dim (the sequence of (batch, seqlen, ...)): its ring rank's
    shard (contiguous_shard or zigzag_shard over ring_size), cut into ulysses_size
    consecutive parts, of which it holds part ulysses_rank (yunchang's extract_local)."""
    fn = "ipex_flash.distributed.usp_shard"
    _ring_fn(fn, ring_impl_type)
    shard = (zigzag_shard if ring_impl_type == "zigzag" else contiguous_shard)(
        x, ring_rank, ring_size, dim)
    return contiguous_shard(shard, ulysses_rank, ulysses_size, dim)


def usp_groups_from_mesh(mesh) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """(ulysses_group, ring_group) of this rank from a 2-D DeviceMesh: the dimensions named
    "ulysses" and "ring", or, unnamed, (ring, ulysses) in that order, so that a Ulysses
    group is consecutive ranks (one node) and the ring runs across them."""
    if getattr(mesh, "ndim", None) != 2:
        raise ValueError("ipex_flash.distributed.usp_groups_from_mesh: mesh must be a 2-D "
                         f"torch.distributed DeviceMesh, got {mesh!r}")
    names = tuple(mesh.mesh_dim_names or ())
    if {"ulysses", "ring"} <= set(names):
        return mesh.get_group("ulysses"), mesh.get_group("ring")
    return mesh.get_group(1), mesh.get_group(0)


def set_seq_parallel_pg(sp_ulysses_degree: int, sp_ring_degree: int, rank: int,
                        world_size: int, use_ulysses_low: bool = True) -> None:
    """yunchang's: creates the Ulysses and ring groups of every rank (every rank must call
    it, in the same order, as for dist.new_group) and keeps this rank's for
    LongContextAttention. world_size / (U x R) copies (data parallel) are laid side by side.
    use_ulysses_low: Ulysses groups are consecutive ranks (else the ring's are)."""
    fn = "ipex_flash.distributed.set_seq_parallel_pg"
    degree = sp_ulysses_degree * sp_ring_degree
    if sp_ulysses_degree < 1 or sp_ring_degree < 1 or world_size % degree:
        raise ValueError(f"{fn}: sp_ulysses_degree x sp_ring_degree = {degree} must divide "
                         f"world_size = {world_size}")
    inner, outer = ((sp_ulysses_degree, sp_ring_degree) if use_ulysses_low
                    else (sp_ring_degree, sp_ulysses_degree))
    mine = {}
    for offset in range(0, world_size, degree):
        low = [list(range(offset + i * inner, offset + (i + 1) * inner)) for i in range(outer)]
        high = [list(range(offset + i, offset + degree, inner)) for i in range(inner)]
        for kind, groups in (("low", low), ("high", high)):
            for ranks in groups:
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine[kind] = group
    low_kind, high_kind = ("ulysses", "ring") if use_ulysses_low else ("ring", "ulysses")
    PROCESS_GROUPS.update({low_kind: mine["low"], high_kind: mine["high"]})


class LongContextAttention(torch.nn.Module):
    """yunchang's LongContextAttention on ipex_flash: forward(query, key, value, dropout_p,
    softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
    return_attn_probs) returns the output only (as yunchang's), computed by
    usp_flash_attn_func.

    The groups: ulysses_group and ring_group, or a 2-D DeviceMesh (usp_groups_from_mesh),
    or, with neither, those set_seq_parallel_pg made. scatter_idx and gather_idx must be
    yunchang's defaults (2, 1: the (batch, seqlen, heads, headdim) layout); use_pack_qkv and
    use_sync are accepted and change nothing.
    """

    def __init__(self, scatter_idx: int = 2, gather_idx: int = 1,
                 ring_impl_type: str = "basic", use_pack_qkv: bool = False,
                 use_sync: bool = False, *, ulysses_group=None, ring_group=None, mesh=None):
        super().__init__()
        fn = "ipex_flash.distributed.LongContextAttention"
        if (scatter_idx, gather_idx) != (2, 1):
            raise ValueError(f"{fn}: scatter_idx and gather_idx must be 2 and 1 (heads and "
                             f"sequence of (batch, seqlen, heads, headdim)), got "
                             f"{scatter_idx} and {gather_idx}")
        _ring_fn(fn, ring_impl_type)
        if mesh is not None:
            ulysses_group, ring_group = usp_groups_from_mesh(mesh)
        elif ulysses_group is None and ring_group is None:
            ulysses_group, ring_group = PROCESS_GROUPS["ulysses"], PROCESS_GROUPS["ring"]
            if ulysses_group is None and ring_group is None:
                raise ValueError(f"{fn}: give ulysses_group and ring_group, or mesh, or call "
                                 "set_seq_parallel_pg first")
        self.ulysses_group: Optional[dist.ProcessGroup] = ulysses_group
        self.ring_group: Optional[dist.ProcessGroup] = ring_group
        self.ring_impl_type = ring_impl_type

    def forward(self, query: Tensor, key: Tensor, value: Tensor, dropout_p=0.0,
                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                alibi_slopes=None, deterministic=False, return_attn_probs=False, *args):
        result = usp_flash_attn_func(
            query, key, value, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
            deterministic, return_attn_probs, ulysses_group=self.ulysses_group,
            ring_group=self.ring_group, ring_impl_type=self.ring_impl_type, softcap=softcap)
        return result[0] if isinstance(result, tuple) else result
