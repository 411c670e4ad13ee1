"""The fixed-length ring (ring.py, stripe.py) as two torch ops, ipex_flash::ring_attention and
its backward, so that torch.compile keeps a ring call whole in its graph (no graph break):
the ops take the group by name and the plan's inputs as numbers, and run eagerly inside:
the agreement between ranks (learned once, _agreement.py), the plan (_blocks.py) and the
ring (_ring_engine.py), or with a window that keeps some ranks apart the direct exchanges
between those it joins (_window_exchange.py). Their fake implementations give the outputs' shapes for tracing.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from ipex_flash.distributed import _blocks
from ipex_flash.distributed._agreement import agreed
from ipex_flash.distributed._checks import AGREED, shape_signature
from ipex_flash.distributed._comm import RingComm, check_same, gather_ints
from ipex_flash.distributed._op_autograd import register_attention_autograd
from ipex_flash.distributed._ring_engine import (
    RingProblem, placed_calls, ring_backward, ring_forward, sinks_grad)
from ipex_flash.distributed._window_exchange import peer_steps, window_backward, window_forward

Tensor = torch.Tensor


def _plans(kind: str, lengths: tuple[int, ...], rank: int, causal: bool,
           window: tuple[int, int], placed: bool = False) -> list[list[_blocks.BlockCall]]:
    """This rank's calls against each rank's K/V shard; placed: each call a run of
    consecutive global positions on both sides (dropout, ALiBi)."""
    world = len(lengths)
    if kind == "stripe":
        return [_blocks.stripe_pair(lengths[rank], rank, lengths[owner], owner, world, causal,
                                    window) for owner in range(world)]
    layout = (_blocks.contiguous_layout(lengths) if kind == "contiguous"
              else _blocks.zigzag_layout(sum(lengths), world))
    return [_blocks.plan_pair(layout[rank], layout[owner], causal, window, placed)
            for owner in range(world)]


def _expected_lengths(kind: str, total: int, world: int) -> list[int]:
    """What zigzag_shard or stripe_shard gives each rank of a sequence of `total` tokens."""
    if kind == "stripe":
        return [(total - r + world - 1) // world for r in range(world)]
    bounds = _blocks.zigzag_bounds(total, world)
    return [bounds[r + 1] - bounds[r] + bounds[2 * world - r] - bounds[2 * world - 1 - r]
            for r in range(world)]


def _check_lengths(fn: str, kind: str, lengths: list[int]) -> None:
    """Each rank must hold what the layout's shard helper gives it of the whole sequence."""
    want = _expected_lengths(kind, sum(lengths), len(lengths))
    if lengths != want:
        raise ValueError(
            f"{fn}: the ranks hold {lengths} tokens of q; {kind}_shard of a sequence of "
            f"{sum(lengths)} tokens over {len(lengths)} ranks gives {want} (shard the batch "
            f"with ipex_flash.distributed.{kind}_shard)")


def _learn(fn: str, kind: str, signature: list[int], device: torch.device,
           group: dist.ProcessGroup, causal: bool, window: tuple[int, int], placed: bool,
           heads: tuple[int, int]):
    """Every rank's arguments, checked to agree, this rank's plan and, with a window, its
    direct exchanges (from every rank's plan): once per key (_agreement.py)."""
    gathered = gather_ints(signature, device, group)
    check_same(fn, [row[1:] for row in gathered], AGREED)
    lengths = [row[0] for row in gathered]
    if kind != "contiguous":
        _check_lengths(fn, kind, lengths)
    comm = RingComm(group)
    plans = _plans(kind, tuple(lengths), comm.rank, causal, window, placed)
    positions = placed_calls(plans, device, heads) if placed else None
    steps = None
    if window[0] >= 0 or (window[1] >= 0 and not causal):  # a window: some ranks may not meet
        needs = [[bool(calls) for calls in _plans(kind, tuple(lengths), x, causal, window)]
                 for x in range(comm.size)]
        steps = peer_steps(needs, comm.rank)
    return comm, lengths, plans, steps, positions


def _problem(fn: str, kind: str, q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor],
             alibi_slopes: Optional[Tensor], dropout_seed: Optional[Tensor], group_name: str,
             causal: bool, window: tuple[int, int], scale: float, softcap: float,
             dropout_p: float, heads: tuple[int, int]) -> RingProblem:
    group = _resolve_process_group(group_name)
    signature = shape_signature(q, k, v, causal, window, softcap, sinks, False, dropout_p,
                                alibi_slopes)
    placed = dropout_p > 0.0 or alibi_slopes is not None
    # heads is not agreed on: the ranks of a ring over a slice of the heads (USP's) hold the
    # same slice by construction of the groups.
    comm, lengths, plans, steps, positions = agreed(
        group, (fn, *signature, *heads), (),
        lambda: _learn(fn, kind, signature, q.device, group, causal, window, placed, heads))
    return RingProblem(comm, plans, lengths, scale, softcap, peer_steps=steps,
                       positions=positions, window=(window[0], 0 if causal else window[1]),
                       alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                       dropout_seed=dropout_seed)


@torch.library.custom_op("ipex_flash::ring_attention", mutates_args=())
def ring_attention(q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor],
                   alibi_slopes: Optional[Tensor], dropout_seed: Optional[Tensor],
                   group_name: str, fn: str, kind: str, causal: bool, window_left: int,
                   window_right: int, scale: float, softcap: float, dropout_p: float,
                   head_offset: int, heads_total: int, backward_follows: bool
                   ) -> tuple[Tensor, Tensor]:
    """(out, lse in the kernels' exp2 domain (B, H, N)) of this rank's queries; the
    arguments already checked on this rank (ring.py). head_offset, heads_total: where the
    heads of q sit among the whole problem's (0, 0: they are all of them)."""
    problem = _problem(fn, kind, q, k, v, sinks, alibi_slopes, dropout_seed, group_name,
                       causal, (window_left, window_right), scale, softcap, dropout_p,
                       (head_offset, heads_total))
    forward = ring_forward if problem.peer_steps is None else window_forward
    return forward(problem, q, k, v, sinks, backward_follows)


@ring_attention.register_fake
def _ring_attention_fake(q, k, v, sinks, alibi_slopes, dropout_seed, group_name, fn, kind,
                         causal, window_left, window_right, scale, softcap, dropout_p,
                         head_offset, heads_total, backward_follows):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op("ipex_flash::ring_attention_backward", mutates_args=())
def ring_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                            lse: Tensor, sinks: Optional[Tensor], alibi_slopes: Optional[Tensor],
                            dropout_seed: Optional[Tensor], group_name: str, fn: str,
                            kind: str, causal: bool, window_left: int, window_right: int,
                            scale: float, softcap: float, dropout_p: float,
                            head_offset: int, heads_total: int, wants_sinks: bool
                            ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, this rank's part of d sinks, or an empty tensor without wants_sinks)."""
    problem = _problem(fn, kind, q, k, v, sinks, alibi_slopes, dropout_seed, group_name,
                       causal, (window_left, window_right), scale, softcap, dropout_p,
                       (head_offset, heads_total))
    backward = ring_backward if problem.peer_steps is None else window_backward
    dq, dk, dv = backward(problem, grad_out, q, k, v, out, lse)
    d_sinks = (sinks_grad(problem, sinks, grad_out, out, lse) if wants_sinks
               else q.new_empty(0, dtype=torch.float32))
    return dq, dk, dv, d_sinks


@ring_attention_backward.register_fake
def _ring_attention_backward_fake(grad_out, q, k, v, out, lse, sinks, alibi_slopes,
                                  dropout_seed, group_name, fn, kind, causal, window_left,
                                  window_right, scale, softcap, dropout_p, head_offset,
                                  heads_total, wants_sinks):
    d_sinks = (sinks.new_empty(sinks.shape, dtype=torch.float32) if wants_sinks
               else q.new_empty(0, dtype=torch.float32))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), d_sinks


register_attention_autograd(ring_attention, torch.ops.ipex_flash.ring_attention_backward,
                            forward_only=1)
