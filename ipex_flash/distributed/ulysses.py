"""Ulysses (DeepSpeed-Ulysses) sequence parallelism: an all-to-all turns each rank's shard of
the sequence with all heads into the whole sequence with 1/P of the heads, flash_attn_func
runs on it unchanged, and the inverse all-to-all brings the output back to the rank's
shard. Every score option works as on one device (ALiBi, windows, softcap, sinks), since
each rank sees whole sequences; dropout too, its kernel call placed at the rank's first
head (_heads_op.py) so that it keeps what one process keeps. nheads must divide by the group
size; K/V heads fewer than the group (or not a multiple of it) are replicated until they
are (GQA/MQA). usp.py runs the same all-to-alls around a ring.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from ipex_flash.distributed import _heads_op  # noqa: F401  (registers the torch ops)
from ipex_flash.distributed._agreement import agreed
from ipex_flash.distributed._checks import AGREED, check_local, shape_signature
from ipex_flash.distributed._comm import all_to_all, check_same, gather_ints, resolve_group
from ipex_flash.flash_attn_interface import flash_attn_func
from ipex_flash.ops.launch import draw_dropout_seed, natural_lse
from ipex_flash.ops.validation import check_alibi

Tensor = torch.Tensor


def _to_heads(x: Tensor, lengths: list[int], group) -> Tensor:
    """(B, n_local, H, D) -> (B, N, H / P, D): rank p receives heads [p H/P, (p+1) H/P) of
    every rank's tokens, and concatenates them in rank order (the sequence's order)."""
    world, rank = len(lengths), dist.get_rank(group)
    batch, n, heads, dim = x.shape
    part = heads // world
    send = x.reshape(batch, n, world, part, dim).permute(2, 0, 1, 3, 4).contiguous()
    sizes = [batch * m * part * dim for m in lengths]
    recv = x.new_empty(sum(sizes))
    all_to_all(recv, send.view(-1), sizes, [batch * n * part * dim] * world, group)
    pieces = [p.view(batch, m, part, dim) for p, m in zip(recv.split(sizes), lengths)]
    assert lengths[rank] == n
    return torch.cat(pieces, dim=1)


def _to_sequence(y: Tensor, lengths: list[int], group) -> Tensor:
    """The inverse of _to_heads: (B, N, H / P, D) -> (B, n_local, H, D)."""
    world, rank = len(lengths), dist.get_rank(group)
    batch, _, part, dim = y.shape
    n = lengths[rank]
    send = torch.cat([p.reshape(-1) for p in y.split(lengths, dim=1)])
    recv = y.new_empty(world * batch * n * part * dim)
    all_to_all(recv, send, [batch * n * part * dim] * world,
               [batch * m * part * dim for m in lengths], group)
    return recv.view(world, batch, n, part, dim).permute(1, 2, 0, 3, 4).reshape(
        batch, n, world * part, dim)


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lengths, group):
        ctx.lengths, ctx.group = lengths, group
        return _to_heads(x, lengths, group)

    @staticmethod
    def backward(ctx, grad):
        return _to_sequence(grad.contiguous(), ctx.lengths, ctx.group), None, None


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, lengths, group):
        ctx.lengths, ctx.group = lengths, group
        return _to_sequence(y, lengths, group)

    @staticmethod
    def backward(ctx, grad):
        return _to_heads(grad.contiguous(), ctx.lengths, ctx.group), None, None


def kv_repeats(fn: str, heads: int, heads_k: int, world: int) -> int:
    """How many copies of each K/V head the all-to-all sends: 1 when the group size divides
    nheads_k, else lcm(nheads_k, P) / nheads_k, so that every rank receives whole K/V heads
    and exactly those its query heads read. (lcm divides nheads, a multiple of both.)"""
    if heads % world:
        raise ValueError(f"{fn}: nheads (q.shape[2]) = {heads} must be a multiple of the "
                         f"Ulysses group size {world}: each rank takes an equal share of the "
                         "query heads")
    return math.lcm(heads_k, world) // heads_k


def agreed_lengths(fn: str, signature: list[int], names, device: torch.device,
                   group) -> list[int]:
    """Every rank's local length, after checking that the rest of `signature` (named by
    `names`) agrees between ranks: one small all_gather the first time a rank sees these
    arguments, none after (_agreement.py)."""
    return _agreed_lengths(fn, tuple(int(x) for x in signature), tuple(names), str(device),
                           group.group_name)


# torch.compile runs this as it traces (every rank traces the same calls, as it would run
# them) and keeps the result as a constant of the graph, which guards on the shapes the
# signature comes from. Its arguments are plain values: the group by name.
@torch.compiler.assume_constant_result
def _agreed_lengths(fn: str, signature: tuple, names: tuple, device: str,
                    group_name: str) -> list[int]:
    group = _resolve_process_group(group_name)

    def learn():
        gathered = gather_ints(signature, torch.device(device), group)
        check_same(fn, [row[1:] for row in gathered], names)
        return [row[0] for row in gathered]
    return agreed(group, (fn, *signature), (), learn)


def to_head_shards(q: Tensor, k: Tensor, v: Tensor, lengths: list[int], repeats: int,
                   group) -> tuple[Tensor, Tensor, Tensor]:
    """(B, n_local, H, D) shards -> (B, N, H / P, D) head shards of the group's sequence,
    differentiable. K/V heads are repeated (adjacent copies, as GQA reads them) first; the
    copies' gradients sum back into the head."""
    if repeats > 1:
        k, v = (t.repeat_interleave(repeats, dim=2) for t in (k, v))
    return tuple(_SequenceToHeads.apply(t.contiguous(), lengths, group) for t in (q, k, v))


def to_sequence_shard(out_h: Tensor, lengths: list[int], group) -> Tensor:
    """The inverse of to_head_shards for the output, differentiable."""
    return _HeadsToSequence.apply(out_h, lengths, group)


def lse_to_sequence_shard(lse_h: Tensor, lengths: list[int], group) -> Tensor:
    """An LSE (B, H / P, N) -> (B, H, n_local); not differentiable."""
    with torch.no_grad():
        lse = _to_sequence(lse_h.transpose(1, 2).unsqueeze(-1).contiguous(), lengths, group)
    return lse.squeeze(-1).transpose(1, 2)


def ulysses_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                            window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                            return_attn_probs=False, group=None, *, softcap=0.0, sinks=None):
    """Attention over a sequence sharded contiguously across the ranks of `group` (as
    ring_flash_attn_func: rank p holds the p-th consecutive slice; lengths may differ),
    computed head-parallel: two all-to-alls of q, k, v and one of the output, each moving
    (P-1)/P of the rank's shard.

    Args:
        q: (batch, seqlen_local, nheads, headdim); k: (batch, seqlen_local, nheads_k,
            headdim), v: (batch, seqlen_local, nheads_k, headdim_v). The group size must
            divide nheads (ValueError otherwise). K/V heads are sent as they are when the
            group size divides nheads_k, else each is replicated lcm(nheads_k, P) / nheads_k
            times (MQA over P ranks: P copies), which adds that much K/V traffic.
        alibi_slopes: (nheads,) or (batch, nheads) float32, as flash_attn_func; global
            positions, since each rank attends over whole sequences.
        window_size, causal, softmax_scale, softcap, sinks: as flash_attn_func on the whole
            sequence. sinks' gradient is this rank's part (see ring_flash_attn_func).
        dropout_p: as flash_attn_func, with the very keep-mask one process's call over the
            whole batch draws: each rank's kernel call is placed at its first query head
            among all nheads, and the seed is one draw per call from torch's generator (seed
            every rank alike).
        deterministic: accepted. return_attn_probs: also return the LSE (batch, nheads,
            seqlen_local), natural log, and None.
        group: the process group (default: the world).

    Returns:
        out (batch, seqlen_local, nheads, headdim_v), or (out, lse, None).
    """
    fn = "ipex_flash.distributed.ulysses_flash_attn_func"
    group = resolve_group(fn, group)
    scale, window = check_local(fn, q, k, v, dropout_p, softmax_scale, window_size, softcap,
                                None, sinks, packed=False, ring=False, placed=True)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    repeats = kv_repeats(fn, q.shape[2], k.shape[2], world)
    check_alibi(fn, alibi_slopes, q.shape[0], q.shape[2], q.device)
    lengths = agreed_lengths(
        fn, shape_signature(q, k, v, causal, window, softcap, sinks, False, dropout_p)
        + [alibi_slopes is not None and alibi_slopes.dim()], (*AGREED, "alibi_slopes given"),
        q.device, group)
    # One draw per call, as flash_attn_func makes: ranks seeded alike keep what it keeps.
    seed = draw_dropout_seed(q.device) if dropout_p > 0.0 else None
    heads = slice(rank * q.shape[2] // world, (rank + 1) * q.shape[2] // world)
    q_h, k_h, v_h = to_head_shards(q, k, v, lengths, repeats, group)
    slopes = None if alibi_slopes is None else alibi_slopes[..., heads].contiguous()
    sinks_h = None if sinks is None else sinks[heads]
    if seed is None:
        out_h = flash_attn_func(q_h, k_h, v_h, 0.0, softmax_scale, causal, window,
                                float(softcap), slopes, deterministic, return_attn_probs,
                                sinks=sinks_h)
        out_h, lse_h = out_h[:2] if return_attn_probs else (out_h, None)
    else:
        # Placed at the rank's first query head (K/V copies change nothing: the keep-mask
        # is drawn per query head).
        out_h, lse_h = torch.ops.ipex_flash.head_slice_attention(
            q_h, k_h, v_h, sinks_h, slopes, seed, scale, bool(causal), window[0], window[1],
            float(softcap), float(dropout_p), heads.start, q.shape[2])
        lse_h = natural_lse(lse_h) if return_attn_probs else None
    out = to_sequence_shard(out_h, lengths, group)
    if not return_attn_probs:
        return out
    return out, lse_to_sequence_shard(lse_h, lengths, group), None
