"""The packed rings (varlen.py, zigzag_varlen.py) as two torch ops, ipex_flash::
ring_varlen_attention and its backward, so that torch.compile keeps a call whole in its graph:
inside them, eagerly, the agreement between ranks (cu_seqlens read and compared once per
tensor, _agreement.py), the plan, and the ring (_ring_engine.py).

Layouts (kind): "contiguous", rank p holding the p-th slice of every sequence; "zigzag",
chunks r and 2P-1-r of 2P of every sequence. Without causal both are the contiguous ring's
plan (every key is visible). Causal zigzag gathers the front halves (chunk r) and back halves
(chunk 2P-1-r) of every sequence into two blocks, [fronts | backs], each packed by the
offsets cu_seqlens // 2, so every kernel call is one half-block against another:

    owner == r:  front x front causal, back x back causal, back x front full
    owner <  r:  front x front full, back x front full     (its back chunk is later)
    owner >  r:  back x front full, back x back full       (r's front chunk is earlier)
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from ipex_flash.distributed._agreement import agreed
from ipex_flash.distributed._blocks import BlockCall
from ipex_flash.distributed._checks import AGREED, shape_signature
from ipex_flash.distributed._comm import RingComm, check_same, gather_ints
from ipex_flash.distributed._op_autograd import register_attention_autograd
from ipex_flash.distributed._ring_engine import (
    LOG2E, RingProblem, ring_backward, ring_forward, sinks_grad)
from ipex_flash.ops.flash_attn_args import BlockPositions
from ipex_flash.ops.validation import check_cu_seqlens

Tensor = torch.Tensor


def _learn(fn: str, signature: list[int], batch: int, cu_seqlens: Tensor, max_seqlen: int,
           total: int, group: dist.ProcessGroup) -> dict:
    """This rank's offsets, checked, and every rank's agreement: once per cu_seqlens tensor
    and arguments, the only place the offsets are read to the host."""
    check_cu_seqlens(fn, "cu_seqlens", cu_seqlens, total, cu_seqlens.device, True)
    offsets = cu_seqlens.tolist()
    longest = max(b - a for a, b in zip(offsets, offsets[1:]))
    if longest > max_seqlen:
        raise ValueError(f"{fn}: a sequence has {longest} local tokens, more than "
                         f"max_seqlen={max_seqlen}")
    gathered = gather_ints(signature + [batch], cu_seqlens.device, group)
    check_same(fn, gathered, ("total_local tokens", *AGREED, "batch (len(cu_seqlens) - 1)"))
    # The same local offsets on every rank: slice p of each sequence at a known place.
    check_same(fn, gather_ints(offsets, cu_seqlens.device, group),
               [f"cu_seqlens[{i}]" for i in range(batch + 1)])
    return {"comm": RingComm(group), "offsets": offsets}


def _contiguous_plans(rank: int, world: int, rows: int, causal: bool) -> list[list[BlockCall]]:
    """Rank r's slice of each sequence follows those of ranks < r: their keys are all
    visible, its own are causal, later ranks' hidden (with causal). rows: cu_seqlens[-1];
    the calls never see the rows after it, which the kernels would leave unwritten and the
    merge would then read."""
    whole = (0, rows)
    plans = []
    for owner in range(world):
        if causal and owner > rank:
            plans.append([])
        else:
            right = 0 if causal and owner == rank else -1
            plans.append([BlockCall(whole, whole, (-1, right))])
    return plans


def _zigzag_plans(rank: int, world: int, rows: int, causal_mask: bool = True
                  ) -> list[list[BlockCall]]:
    """Causal calls over [fronts | backs] rows (rows: the real rows, cu_seqlens[-1]);
    without causal_mask every half against every half, each a run of consecutive global
    positions per sequence (dropout, ALiBi)."""
    front, back = (0, rows // 2), (rows // 2, rows)
    full, causal = (-1, -1), (-1, 0)
    if not causal_mask:
        return [[BlockCall(mine, theirs, full) for mine in (front, back)
                 for theirs in (front, back)] for _ in range(world)]
    plans = []
    for owner in range(world):
        if owner == rank:
            plans.append([BlockCall(front, front, causal), BlockCall(back, back, causal),
                          BlockCall(back, front, full)])
        elif owner < rank:
            plans.append([BlockCall(front, front, full), BlockCall(back, front, full)])
        else:
            plans.append([BlockCall(back, front, full), BlockCall(back, back, full)])
    return plans


def _halves(fn: str, learned: dict, device: torch.device) -> dict:
    """Where [fronts | backs] rows come from in the packed order, and the halves' offsets:
    made on the first call for this cu_seqlens, kept with what the group agreed on."""
    if "halves" not in learned:
        offsets = learned["offsets"]
        odd = [b - a for a, b in zip(offsets, offsets[1:]) if (b - a) % 2]
        if odd:  # offsets agree between ranks, so every rank raises here alike
            raise ValueError(
                f"{fn}: every sequence's local length must be even (two equal chunks of it, "
                f"so every global length a multiple of 2 * world_size), got {odd} in "
                "cu_seqlens (shard with ipex_flash.distributed.zigzag_varlen_shard)")
        pairs = list(zip(offsets, offsets[1:]))
        order = torch.cat([torch.arange(a, (a + b) // 2) for a, b in pairs]
                          + [torch.arange((a + b) // 2, b) for a, b in pairs])
        learned["halves"] = {
            "order": order.to(device),
            "cu": torch.tensor([o // 2 for o in offsets], dtype=torch.int32, device=device)}
    return learned["halves"]


def _placed(learned: dict, problem: RingProblem, kind: str, causal: bool,
            device: torch.device) -> list[list[BlockPositions]]:
    """Every call's global positions, per sequence (_blocks.BlockCall.starts' packed form):
    slice p of a sequence of local length L starts at p L; zigzag's front chunk of rank r at
    r L/2 and its back chunk at (2P-1-r) L/2. Made once per plan, kept with what the group
    agreed on."""
    key = ("placed", kind, causal)  # the plan's calls follow from these
    if key not in learned:
        offsets, (rank, world) = learned["offsets"], (problem.comm.rank, problem.comm.size)
        lengths = [b - a for a, b in zip(offsets, offsets[1:])]
        rows = offsets[-1]

        def chunk(owner: int, call_rows: tuple[int, int], length: int) -> int:
            if kind != "zigzag":
                return owner * length
            back = call_rows != (0, rows // 2)
            return (2 * world - 1 - owner if back else owner) * (length // 2)

        learned[key] = [[BlockPositions.of(
            [(0, chunk(rank, call.q_rows, n), chunk(owner, call.k_rows, n)) for n in lengths],
            device) for call in calls] for owner, calls in enumerate(problem.plans)]
    return learned[key]


def _setup(fn, kind, q, k, v, sinks, alibi_slopes, dropout_seed, cu_seqlens, max_seqlen,
           group_name, causal, window, scale, softcap, dropout_p):
    """(the problem, the [fronts | backs] order or None)."""
    group = _resolve_process_group(group_name)
    batch = cu_seqlens.shape[0] - 1
    signature = shape_signature(q, k, v, causal, window, softcap, sinks, True, dropout_p,
                                alibi_slopes)
    learned = agreed(group, (fn, *signature, batch, max_seqlen), (cu_seqlens,),
                     lambda: _learn(fn, signature, batch, cu_seqlens, max_seqlen, q.shape[0],
                                    group))
    comm, rows = learned["comm"], learned["offsets"][-1]
    # Windows, ALiBi and dropout are measured in each sequence's global positions: every
    # call is placed there (BlockPositions).
    placed = dropout_p > 0.0 or alibi_slopes is not None or window != (-1, -1)
    extras = dict(alibi_slopes=alibi_slopes, dropout_p=dropout_p, dropout_seed=dropout_seed,
                  window=(window[0], 0 if causal else window[1]))
    if kind == "zigzag" and (causal or placed):
        halves = _halves(fn, learned, q.device)
        problem = RingProblem(comm, _zigzag_plans(comm.rank, comm.size, rows, causal),
                              [rows] * comm.size, scale, softcap,
                              varlen=(halves["cu"], max_seqlen // 2), **extras)
        order = halves["order"]
    else:
        problem = RingProblem(comm, _contiguous_plans(comm.rank, comm.size, rows, causal),
                              [q.shape[0]] * comm.size, scale, softcap,
                              varlen=(cu_seqlens.contiguous(), max_seqlen), packed_rows=rows,
                              **extras)
        order = None
    if placed:
        problem.positions = _placed(learned, problem, "zigzag" if order is not None else "",
                                    causal, q.device)
    return problem, order


@torch.library.custom_op("ipex_flash::ring_varlen_attention", mutates_args=())
def ring_varlen_attention(q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor],
                          alibi_slopes: Optional[Tensor], dropout_seed: Optional[Tensor],
                          cu_seqlens: Tensor, max_seqlen: int, group_name: str, fn: str,
                          kind: str, causal: bool, window_left: int, window_right: int,
                          scale: float, softcap: float, dropout_p: float,
                          backward_follows: bool) -> tuple[Tensor, Tensor]:
    """(out, lse in the kernels' exp2 domain (H, total_local)); rows past cu_seqlens[-1]:
    out 0, lse -inf (or the sink's logit)."""
    problem, order = _setup(fn, kind, q, k, v, sinks, alibi_slopes, dropout_seed, cu_seqlens,
                            max_seqlen, group_name, causal, (window_left, window_right), scale,
                            softcap, dropout_p)
    if order is None:
        return ring_forward(problem, q, k, v, sinks, backward_follows)
    # Only the real rows are gathered: padding past cu_seqlens[-1] is never read.
    halves = [t.index_select(0, order) for t in (q, k, v)]
    out_h, lse_h = ring_forward(problem, *halves, sinks, backward_follows)
    out = q.new_zeros((*q.shape[:-1], v.shape[-1])).index_copy_(0, order, out_h)
    lse = lse_h.new_full((q.shape[1], q.shape[0]), float("-inf"))
    if sinks is not None:
        lse.copy_((sinks.float() * LOG2E)[:, None].expand_as(lse))
    return out, lse.index_copy_(1, order, lse_h)


@ring_varlen_attention.register_fake
def _ring_varlen_attention_fake(q, k, v, sinks, alibi_slopes, dropout_seed, cu_seqlens,
                                max_seqlen, group_name, fn, kind, causal, window_left,
                                window_right, scale, softcap, dropout_p, backward_follows):
    return (q.new_empty((*q.shape[:-1], v.shape[-1])),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


@torch.library.custom_op("ipex_flash::ring_varlen_attention_backward", mutates_args=())
def ring_varlen_attention_backward(
        grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
        sinks: Optional[Tensor], alibi_slopes: Optional[Tensor], dropout_seed: Optional[Tensor],
        cu_seqlens: Tensor, max_seqlen: int, group_name: str, fn: str, kind: str, causal: bool,
        window_left: int, window_right: int, scale: float, softcap: float, dropout_p: float,
        wants_sinks: bool
        ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, this rank's part of d sinks or an empty tensor); padding rows' 0."""
    problem, order = _setup(fn, kind, q, k, v, sinks, alibi_slopes, dropout_seed, cu_seqlens,
                            max_seqlen, group_name, causal, (window_left, window_right), scale,
                            softcap, dropout_p)
    if order is not None:
        rows = [t.index_select(0, order) for t in (grad_out, q, k, v, out)]
        grad_out, q_h, k_h, v_h, out = rows
        lse = lse.index_select(1, order)
        grads = ring_backward(problem, grad_out, q_h, k_h, v_h, out, lse)
        dq, dk, dv = (torch.zeros_like(t).index_copy_(0, order, g)
                      for t, g in zip((q, k, v), grads))
    else:
        dq, dk, dv = ring_backward(problem, grad_out, q, k, v, out, lse)
    d_sinks = (sinks_grad(problem, sinks, grad_out, out, lse) if wants_sinks
               else q.new_empty(0, dtype=torch.float32))
    return dq, dk, dv, d_sinks


@ring_varlen_attention_backward.register_fake
def _ring_varlen_attention_backward_fake(grad_out, q, k, v, out, lse, sinks, *args):
    d_sinks = (sinks.new_empty(sinks.shape, dtype=torch.float32) if args[-1]
               else q.new_empty(0, dtype=torch.float32))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), d_sinks


register_attention_autograd(ring_varlen_attention,
                            torch.ops.ipex_flash.ring_varlen_attention_backward, forward_only=1)
