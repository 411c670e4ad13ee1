"""The ring: forward and backward passes over the K/V shards of a process group, run inside
the torch ops of every ring entry point (_ring_op.py for ring.py and stripe.py, _varlen_op.py
for varlen.py and zigzag_varlen.py).

At step s rank r holds the K/V shard of rank (r - s) mod P. Before computing on it, it posts
the send of that shard to r+1 and the receive of the next from r-1, so the transfer runs
under the kernels. Each step's partial outputs are merged into a float32 accumulator by
their LSEs. The LSE stays in the kernels' exp2 domain (log2 of the sum of exp2 of the scaled
scores, launch.natural_lse) throughout: the backward kernels read it so, to recompute the
very probabilities of the forward.

The backward visits the shards in the same order. dQ accumulates locally; dK and dV of the
visited shard travel the ring with it, each rank adding its part (float32), and arrive back
at their owner after the last step.

With a window, ranks whose tokens cannot see each other exchange nothing: _window_exchange.py
walks the same per-shard calls (forward_calls, backward_calls) over direct exchanges between
the ranks the window joins.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ipex_flash.distributed._blocks import BlockCall
from ipex_flash.distributed._comm import RingComm
from ipex_flash.ops import score_grads
from ipex_flash.ops.flash_attn import attend, attend_backward
from ipex_flash.ops.flash_attn_args import BlockPositions
from ipex_flash.ops.launch import LN2

Tensor = torch.Tensor
LOG2E = 1.0 / LN2


@dataclass
class RingProblem:
    """One call's plan, the same for its forward and backward."""
    comm: RingComm
    plans: list[list[BlockCall]]   # by owner rank: this rank's calls against that K/V shard
    kv_lengths: list[int]          # tokens of each rank's K/V shard
    scale: float
    softcap: float
    # Packed sequences (varlen.py): (cu_seqlens, max_seqlen), the same on every rank.
    varlen: Optional[tuple[Tensor, int]] = None
    # Rows of the packed q, k, v that hold sequences, cu_seqlens[-1]: the calls stop there,
    # the rows after it (padding) keep the accumulators' zeros, and the sinks' gradient stops
    # there too.
    packed_rows: Optional[int] = None
    # With a window that keeps some ranks from seeing each other: the direct exchanges
    # between the ranks it joins (_window_exchange.py) instead of the whole ring.
    peer_steps: Optional[list] = None
    # With dropout or ALiBi: where each call of plans sits globally (placed_calls), which
    # the kernels draw dropout and measure ALiBi at.
    positions: Optional[list[list[BlockPositions]]] = None
    # The global window as the kernels take it (causal: right 0), which placed calls are
    # masked by from their global diagonal (unplaced ones by their own call.window).
    window: tuple[int, int] = (-1, -1)
    alibi_slopes: Optional[Tensor] = None
    dropout_p: float = 0.0
    dropout_seed: Optional[Tensor] = None   # one draw for the whole call, every block's

    @property
    def token_dim(self) -> int:  # (B, N, H, D), or (total, H, D) packed
        return 0 if self.varlen is not None else 1

    def shard_like(self, t: Tensor, owner: int, dtype: Optional[torch.dtype] = None) -> Tensor:
        shape = list(t.shape)
        shape[self.token_dim] = self.kv_lengths[owner]
        return t.new_empty(shape, dtype=dtype or t.dtype)


def _rows(t: Tensor, rows: tuple[int, int], dim: int) -> Tensor:
    return t.narrow(dim, rows[0], rows[1] - rows[0])


def _per_row(w: Tensor) -> Tensor:
    """An LSE-shaped (..., H, n) tensor broadcast against outputs (..., n, H, Dv)."""
    return w.movedim(-1, -2).unsqueeze(-1)


def placed_calls(plans: list[list[BlockCall]], device: torch.device,
                 heads: tuple[int, int] = (0, 0)) -> list[list[BlockPositions]]:
    """The global positions of every call of plans whose rows and keys are runs of
    consecutive positions (plan_pair with placed), one table each, made once per plan.
    heads: (global query head of the calls' head 0, the whole problem's query heads), where
    the ring runs over a slice of the heads (USP's); (0, 0): all of them."""
    return [[BlockPositions.of([(0, *call.starts)], device, *heads) for call in calls]
            for calls in plans]


def _kernel_args(problem: RingProblem, call: BlockCall, positions: Optional[BlockPositions]):
    cu, longest = problem.varlen if problem.varlen is not None else (None, 0)
    window = call.window if positions is None else problem.window
    return (cu, cu, longest, longest, problem.scale, False, *window, problem.softcap,
            problem.alibi_slopes, problem.dropout_p, problem.dropout_seed)


def _calls(problem: RingProblem, owner: int):
    """(call, its BlockPositions or None) of this rank against owner's shard."""
    calls = problem.plans[owner]
    placed = problem.positions[owner] if problem.positions is not None else [None] * len(calls)
    return zip(calls, placed)


def _block_forward(problem, q, k, v, call, positions, backward_follows):
    dim = problem.token_dim
    q_block = _rows(q, call.q_rows, dim)
    if backward_follows:
        # The op runs the general kernel, whose arithmetic the backward kernels mirror,
        # for inputs that need gradients (small blocks would take the decode kernel).
        q_block = q_block.detach().requires_grad_()
    return attend(q_block, _rows(k, call.k_rows, dim), _rows(v, call.k_rows, dim),
                  *_kernel_args(problem, call, positions), None, positions)


def merge_into(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor,
               rows: tuple[int, int], dim: int) -> None:
    """out, lse (float32 accumulators) <- their rows merged with a block's partial result:
    lse' = log2(2^lse + 2^block_lse), out' = out 2^(lse - lse') + block_out 2^(block_lse - lse')."""
    acc_out, acc_lse = _rows(out, rows, dim), _rows(lse, rows, lse.dim() - 1)
    merged = torch.logaddexp2(acc_lse, block_lse)
    # Rows that have seen no key yet (-inf on both sides): weights 0, never -inf - -inf.
    ref = torch.where(torch.isneginf(merged), torch.zeros_like(merged), merged)
    acc_out.mul_(_per_row(torch.exp2(acc_lse - ref)))
    acc_out.add_(block_out.float() * _per_row(torch.exp2(block_lse - ref)))
    acc_lse.copy_(merged)


def add_sinks(out: Tensor, lse: Tensor, sinks: Tensor) -> None:
    """Each sink joins its head's denominators once, after every shard has been merged: its
    logit (natural log) enters the exp2-domain LSE as sink * log2(e); it has no value."""
    sink = (sinks.float() * LOG2E).view(-1, 1).expand_as(lse)
    merged = torch.logaddexp2(lse, sink)
    out.mul_(_per_row(torch.exp2(lse - merged)))
    lse.copy_(merged)


def accumulators(problem: RingProblem, q: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """The float32 output (zeros) and exp2-domain LSE (-inf: nothing seen yet) of this
    rank's rows: (B, H, N), or (H, total) packed."""
    out = q.new_zeros((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)
    lse_shape = (q.shape[1], q.shape[0]) if problem.varlen is not None else (
        q.shape[0], q.shape[2], q.shape[1])
    return out, torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device)


def forward_calls(problem: RingProblem, q: Tensor, shard: list[Tensor], owner: int,
                  out: Tensor, lse: Tensor, backward_follows: bool) -> None:
    """This rank's calls against the K/V shard of `owner`, merged into out and lse."""
    for call, positions in _calls(problem, owner):
        block_out, block_lse = _block_forward(problem, q, *shard, call, positions,
                                              backward_follows)
        merge_into(out, lse, block_out, block_lse, call.q_rows, problem.token_dim)


def ring_forward(problem: RingProblem, q: Tensor, k: Tensor, v: Tensor,
                 sinks: Optional[Tensor], backward_follows: bool) -> tuple[Tensor, Tensor]:
    """(out in q's dtype, lse float32 exp2 domain: (B, H, N), or (H, total) packed)."""
    comm = problem.comm
    out, lse = accumulators(problem, q, v)
    shard = [k.contiguous(), v.contiguous()]
    for step in range(comm.size):
        owner = (comm.rank - step) % comm.size
        pending = None
        if step + 1 < comm.size:  # the next shard travels while this one is computed on
            source = (owner - 1) % comm.size
            pending = comm.exchange(shard, [problem.shard_like(t, source) for t in shard])
        forward_calls(problem, q, shard, owner, out, lse, backward_follows)
        if pending is not None:
            shard = pending.wait()
    if sinks is not None:
        add_sinks(out, lse, sinks)
    return out.to(q.dtype), lse


def backward_calls(problem: RingProblem, grad_out: Tensor, q: Tensor, shard: list[Tensor],
                   owner: int, out: Tensor, lse: Tensor, dq: Tensor) -> tuple[Tensor, Tensor]:
    """This rank's calls against the K/V shard of `owner`: their dQ added into dq (float32),
    their dK and dV returned (float32, the shard's shape)."""
    dim = problem.token_dim
    dk, dv = (torch.zeros_like(t, dtype=torch.float32) for t in shard)
    for call, positions in _calls(problem, owner):
        q_rows = lambda t: _rows(t, call.q_rows, dim)  # noqa: E731
        k_rows = lambda t: _rows(t, call.k_rows, dim)  # noqa: E731
        dq_b, dk_b, dv_b = attend_backward(
            q_rows(grad_out), q_rows(q), k_rows(shard[0]), k_rows(shard[1]), q_rows(out),
            _rows(lse, call.q_rows, lse.dim() - 1), *_kernel_args(problem, call, positions),
            positions)
        q_rows(dq).add_(dq_b)
        k_rows(dk).add_(dk_b)
        k_rows(dv).add_(dv_b)
    return dk, dv


def ring_backward(problem: RingProblem, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor,
                  out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    comm = problem.comm
    grad_out = grad_out.contiguous()
    dq = torch.zeros_like(q, dtype=torch.float32)
    shard = [k.contiguous(), v.contiguous()]
    grads_pending = None
    for step in range(comm.size):
        owner = (comm.rank - step) % comm.size
        source = (owner - 1) % comm.size
        pending = None
        if step + 1 < comm.size:
            pending = comm.exchange(shard, [problem.shard_like(t, source) for t in shard])
        dk, dv = backward_calls(problem, grad_out, q, shard, owner, out, lse, dq)
        if comm.size == 1:
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
        if grads_pending is not None:  # what the ranks before this one added to this shard
            before_dk, before_dv = grads_pending.wait()
            dk.add_(before_dk)
            dv.add_(before_dv)
        grads_pending = comm.exchange(
            [dk, dv], [problem.shard_like(t, source, torch.float32) for t in shard])
        if pending is not None:
            shard = pending.wait()
    dk, dv = grads_pending.wait()  # this rank's own shard, every rank's part added
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def sinks_grad(problem: RingProblem, sinks: Tensor, grad_out: Tensor, out: Tensor,
               lse: Tensor) -> Tensor:
    """This rank's part of d loss / d sinks (from its own query rows): summed over the group
    like any replicated parameter's gradient (by DDP/FSDP or an all_reduce)."""
    delta = score_grads.output_delta(grad_out, out)  # (B, N, H), or (total, H) packed
    if problem.varlen is not None:
        rows = problem.packed_rows  # padding: its grad_out is anything, its lse -inf or the sink
        return score_grads.sinks_grad(sinks, lse[:, :rows].unsqueeze(0),
                                      delta[:rows].transpose(0, 1).unsqueeze(0))
    return score_grads.sinks_grad(sinks, lse, delta.transpose(1, 2))
