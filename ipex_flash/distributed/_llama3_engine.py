"""The all-gather engine of llama3_flash_attn_varlen_func (llama3.py; run inside the torch ops
of _llama3_op.py): K/V gathered heads_k_stride K/V heads at a time, the next group travelling
while the current one is computed on; the kernels' forward over each group's query heads;
in the backward, dK/dV reduce-scattered in float32 to the ranks that own them. With dropout,
or without causal a window or ALiBi, each group's call is placed (BlockPositions) at its
sequences' indices in the whole batch, their queries' and keys' positions in their sequences,
and its first query head, so that it keeps what one process's flash_attn_varlen_func keeps
and measures windows and ALiBi from each sequence's global diagonal (without causal a rank's
keys run past its queries, and the kernels' own diagonal is the end of those keys).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ipex_flash.ops.flash_attn import attend, attend_backward
from ipex_flash.ops.flash_attn_args import BlockPositions

Tensor = torch.Tensor


def _all_gather(*args, **kwargs):
    # torch 2.13 renamed the single-tensor collectives; older releases have the old names.
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(
        *args, **kwargs)


def _reduce_scatter(*args, **kwargs):
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(
        *args, **kwargs)


class Llama3Problem:
    """What the forward and backward share: the group, the offsets and the options."""

    def __init__(self, group, cu_q, cu_k, max_q, max_k, stride, k_slice, scale, causal,
                 window, softcap, alibi, dropout_p=0.0, dropout_seed=None, positions=None):
        self.group, self.world = group, dist.get_world_size(group)
        self.cu_q, self.cu_k, self.max_q, self.max_k = cu_q, cu_k, max_q, max_k
        self.stride, self.k_slice, self.scale, self.causal = stride, k_slice, scale, causal
        self.window, self.softcap, self.alibi = window, softcap, alibi
        self.dropout_p, self.dropout_seed = dropout_p, dropout_seed
        self.positions = positions  # placed_groups' tables, one per group (needs_placing)

    def kernel_args(self, q_heads: slice):
        alibi = None if self.alibi is None else self.alibi[..., q_heads].contiguous()
        return (self.cu_q, self.cu_k, self.max_q, self.max_k, self.scale, self.causal,
                *self.window, self.softcap, alibi, self.dropout_p, self.dropout_seed)

    def placed(self, group_index: int):
        return None if self.positions is None else self.positions[group_index]


def placed_groups(ranks: list[tuple[int, int]], rank: int, tokens: int, k_start: int,
                  cu_q: list[int], cu_k: list[int], heads_q: int, heads_k: int, stride: int,
                  device) -> list[BlockPositions]:
    """Each head group's table (BlockPositions) for this rank's sequences. ranks: every
    rank's (local sequences, whether its first one began on an earlier rank). The layout is
    llama3_flash_attn_prepare_cu_seqlens': rank r holds stream tokens [r n, (r+1) n), and
    each local sequence's keys start where the sequence starts, stream position k_start +
    cu_k[b], so key 0 is at position 0 of its sequence and query 0 at the distance between
    the two. Local sequence 0 of rank r is global sequence sum over r' < r of the sequences
    r' holds, less those that began on the rank before r' (counted there already)."""
    first = sum(count for count, _ in ranks[:rank]) - sum(began for _, began in
                                                          ranks[1:rank + 1])
    entries = [(first, rank * tokens + cu_q[b] - k_start - cu_k[b], 0)
               for b in range(len(cu_q) - 1)]
    per_kv = heads_q // heads_k
    return [BlockPositions.of(entries, device, head * per_kv, heads_q)
            for head in range(0, heads_k, stride)]


def began_before(rank: int, tokens: int, k_start: int) -> int:
    """Whether this rank's first sequence began on an earlier rank (its keys start before
    its first token)."""
    return int(k_start < rank * tokens)


class _KVGather:
    """All-gathers K and V of heads_k_stride K/V heads at a time, side by side in one
    (P * n, stride * (D + Dv)) buffer: one collective per group of heads, the next group
    posted before the current one is used (so it travels under the kernels)."""

    def __init__(self, problem: Llama3Problem, k: Tensor, v: Tensor):
        self.problem, self.k, self.v = problem, k, v
        self.pending = None

    def post(self, first_head: int) -> None:
        heads = slice(first_head, first_head + self.problem.stride)
        n = self.k.shape[0]
        send = torch.cat([self.k[:, heads].reshape(n, -1), self.v[:, heads].reshape(n, -1)], 1)
        recv = send.new_empty((n * self.problem.world, send.shape[1]))
        work = _all_gather(recv, send, group=self.problem.group, async_op=True)
        self.pending = (work, recv, send)

    def take(self) -> tuple[Tensor, Tensor]:
        """The posted group's K and V over local_k_slice: (m, stride, D), (m, stride, Dv)."""
        work, recv, _ = self.pending
        work.wait()
        self.pending = None
        stride, dim_k = self.problem.stride, self.k.shape[-1]
        rows = recv[self.problem.k_slice]
        return (rows[:, :stride * dim_k].view(len(rows), stride, dim_k),
                rows[:, stride * dim_k:].view(len(rows), stride, self.v.shape[-1]))


def _head_groups(problem: Llama3Problem, heads_q: int, heads_k: int):
    """(K/V head offset, the q heads that read those K/V heads) for each group."""
    per_kv = heads_q // heads_k
    for first in range(0, heads_k, problem.stride):
        yield first, slice(first * per_kv, (first + problem.stride) * per_kv)


def llama3_forward(problem: Llama3Problem, q, k, v, sinks, backward_follows: bool):
    gather = _KVGather(problem, k, v)
    gather.post(0)
    outs, lses = [], []
    for index, (first, q_heads) in enumerate(_head_groups(problem, q.shape[1], k.shape[1])):
        k_i, v_i = gather.take()
        if first + problem.stride < k.shape[1]:
            gather.post(first + problem.stride)
        q_i = q[:, q_heads]
        if backward_follows:  # the general kernel, whose arithmetic the backward mirrors
            q_i = q_i.detach().requires_grad_()
        out_i, lse_i = attend(q_i, k_i, v_i, *problem.kernel_args(q_heads),
                              None if sinks is None else sinks[q_heads], problem.placed(index))
        outs.append(out_i)
        lses.append(lse_i)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=0)  # lse: (H, total), exp2 domain


def llama3_backward(problem: Llama3Problem, grad_out, q, k, v, out, lse):
    """dq; dk and dv reduce-scattered in float32 (each rank's part of every key's gradient
    summed once, then rounded), back to the ranks that own those keys."""
    n, heads_k, dim_k, dim_v = k.shape[0], k.shape[1], k.shape[-1], v.shape[-1]
    dq = torch.empty_like(q)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    gather = _KVGather(problem, k, v)
    gather.post(0)
    width = problem.stride * (dim_k + dim_v)
    for index, (first, q_heads) in enumerate(_head_groups(problem, q.shape[1], heads_k)):
        k_i, v_i = gather.take()
        if first + problem.stride < heads_k:
            gather.post(first + problem.stride)
        dq_i, dk_i, dv_i = attend_backward(
            grad_out[:, q_heads], q[:, q_heads], k_i, v_i, out[:, q_heads], lse[q_heads],
            *problem.kernel_args(q_heads), problem.placed(index))
        dq[:, q_heads] = dq_i
        partial = torch.zeros((n * problem.world, width), dtype=torch.float32, device=k.device)
        rows = partial[problem.k_slice]
        rows[:, :problem.stride * dim_k] = dk_i.reshape(len(rows), -1)
        rows[:, problem.stride * dim_k:] = dv_i.reshape(len(rows), -1)
        mine = partial.new_empty((n, width))
        _reduce_scatter(mine, partial, group=problem.group)
        heads = slice(first, first + problem.stride)
        dk[:, heads] = mine[:, :problem.stride * dim_k].view(n, problem.stride, dim_k)
        dv[:, heads] = mine[:, problem.stride * dim_k:].view(n, problem.stride, dim_v)
    return dq, dk, dv
