"""All-gather context parallelism over packed sequences (Llama 3's, ring-flash-attention's
llama3_flash_attn_varlen_func): the packed token stream of a batch is cut into P equal
contiguous slices, one per rank, so a sequence may start on one rank and end on another.
Each rank all-gathers K and V (heads_k_stride K/V heads at a time, the next group travelling
while the current one is computed on) and attends its queries to the keys its sequences
need, local_k_slice of the gathered stream (llama3_layout.py works out those offsets). The
backward gathers K/V again and reduce-scatters dK/dV back to the ranks that own them.

    cu_q, cu_k, max_q, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(
        cu_seqlens, causal=True, rank=rank, world_size=world)
    out = llama3_flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                        heads_k_stride=1, local_k_slice=k_slice, causal=True)
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ipex_flash.distributed._comm import resolve_group
from ipex_flash.distributed._llama3_checks import agree, check_arguments
from ipex_flash.distributed.llama3_layout import llama3_flash_attn_prepare_cu_seqlens
from ipex_flash.ops import flash_attn as _flash_attn_ops  # noqa: F401  (registers the ops)
from ipex_flash.ops import score_grads
from ipex_flash.ops.launch import natural_lse
from ipex_flash.ops.validation import softmax_scale as resolve_scale

Tensor = torch.Tensor
__all__ = ["llama3_flash_attn_prepare_cu_seqlens", "llama3_flash_attn_varlen_func",
           "llama3_flash_attn_varlen_kvpacked_func", "llama3_flash_attn_varlen_qkvpacked_func"]


def _all_gather(*args, **kwargs):
    # torch 2.13 renamed the single-tensor collectives; older releases have the old names.
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(
        *args, **kwargs)


def _reduce_scatter(*args, **kwargs):
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(
        *args, **kwargs)


class _Problem:
    """What the forward and backward share: the group, the offsets and the options."""

    def __init__(self, group, cu_q, cu_k, max_q, max_k, stride, k_slice, scale, causal,
                 window, softcap, alibi):
        self.group, self.world = group, dist.get_world_size(group)
        self.cu_q, self.cu_k, self.max_q, self.max_k = cu_q, cu_k, max_q, max_k
        self.stride, self.k_slice, self.scale, self.causal = stride, k_slice, scale, causal
        self.window, self.softcap, self.alibi = window, softcap, alibi

    def kernel_args(self, q_heads: slice):
        alibi = None if self.alibi is None else self.alibi[..., q_heads].contiguous()
        return (self.cu_q, self.cu_k, self.max_q, self.max_k, self.scale, self.causal,
                *self.window, self.softcap, alibi, 0.0, None)


class _KVGather:
    """All-gathers K and V of heads_k_stride K/V heads at a time, side by side in one
    (P * n, stride * (D + Dv)) buffer: one collective per group of heads, the next group
    posted before the current one is used (so it travels under the kernels)."""

    def __init__(self, problem: _Problem, k: Tensor, v: Tensor):
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


def _head_groups(problem: _Problem, heads_q: int, heads_k: int):
    """(K/V head offset, the q heads that read those K/V heads) for each group."""
    per_kv = heads_q // heads_k
    for first in range(0, heads_k, problem.stride):
        yield first, slice(first * per_kv, (first + problem.stride) * per_kv)


def _forward(problem: _Problem, q, k, v, sinks, backward_follows: bool):
    gather = _KVGather(problem, k, v)
    gather.post(0)
    outs, lses = [], []
    for first, q_heads in _head_groups(problem, q.shape[1], k.shape[1]):
        k_i, v_i = gather.take()
        if first + problem.stride < k.shape[1]:
            gather.post(first + problem.stride)
        q_i = q[:, q_heads]
        if backward_follows:  # the general kernel, whose arithmetic the backward mirrors
            q_i = q_i.detach().requires_grad_()
        out_i, lse_i = torch.ops.ipex_flash.flash_attn_forward(
            q_i, k_i, v_i, *problem.kernel_args(q_heads),
            None if sinks is None else sinks[q_heads])
        outs.append(out_i)
        lses.append(lse_i)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=0)  # lse: (H, total), exp2 domain


def _backward(problem: _Problem, grad_out, q, k, v, out, lse):
    """dq; dk and dv reduce-scattered in float32 (each rank's part of every key's gradient
    summed once, then rounded), back to the ranks that own those keys."""
    n, heads_k, dim_k, dim_v = k.shape[0], k.shape[1], k.shape[-1], v.shape[-1]
    dq = torch.empty_like(q)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    gather = _KVGather(problem, k, v)
    gather.post(0)
    width = problem.stride * (dim_k + dim_v)
    for first, q_heads in _head_groups(problem, q.shape[1], heads_k):
        k_i, v_i = gather.take()
        if first + problem.stride < heads_k:
            gather.post(first + problem.stride)
        dq_i, dk_i, dv_i = torch.ops.ipex_flash.flash_attn_backward(
            grad_out[:, q_heads], q[:, q_heads], k_i, v_i, out[:, q_heads], lse[q_heads],
            *problem.kernel_args(q_heads))
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


class _Llama3Attention(torch.autograd.Function):
    """(q, k, v, sinks, problem) -> (out, lse exp2 domain); lse is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, problem):
        backward_follows = any(t is not None and t.requires_grad for t in (q, k, v, sinks))
        out, lse = _forward(problem, q, k, v, sinks, backward_follows)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.problem = problem
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable  # the backward runs kernels and collectives, not torch ops
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dq, dk, dv = _backward(ctx.problem, grad_out, q, k, v, out, lse)
        d_sinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            # This rank's part, from its own query rows: summed over the group like any
            # replicated parameter's gradient (DDP/FSDP, or an all_reduce).
            delta = score_grads.output_delta(grad_out, out)  # (total, H)
            d_sinks = score_grads.sinks_grad(sinks, lse.unsqueeze(0),
                                             delta.transpose(0, 1).unsqueeze(0))
        return dq, dk, dv, d_sinks, None


def llama3_flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, heads_k_stride, local_k_slice, dropout_p=0.0,
                                  softmax_scale=None, causal=False, window_size=(-1, -1),
                                  alibi_slopes=None, deterministic=False,
                                  return_attn_probs=False, group=None, *, softcap=0.0,
                                  sinks=None):
    """Attention over packed sequences whose token stream is split into equal contiguous
    slices across the ranks of `group`, by all-gathering K/V.

    Args:
        q: (total_local, nheads, headdim), this rank's slice of the packed queries; k, v:
            (total_local, nheads_k, headdim / headdim_v), the same tokens.
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, local_k_slice: what
            llama3_flash_attn_prepare_cu_seqlens(cu_seqlens, causal, rank, world_size) gives
            (int32 offsets, made with the same causal).
        heads_k_stride: K/V heads gathered at a time (must divide nheads_k): the gathered
            buffers hold P * total_local * heads_k_stride keys, two of them in flight.
        dropout_p: must be 0 (NotImplementedError).
        causal: each token sees the tokens of its sequence up to itself, on any rank.
        window_size, alibi_slopes: in positions of the whole sequence; need causal=True.
            alibi_slopes: (nheads,) or (local batch, nheads) float32.
        softmax_scale, softcap, sinks: as flash_attn_varlen_func. sinks' gradient is this
            rank's part (sum it over the group, as DDP/FSDP do).
        deterministic: accepted; the result is always deterministic.
        return_attn_probs: also return the LSE (nheads, total_local) float32, natural log,
            and None.
        group: the process group (default: the world).

    Returns:
        out (total_local, nheads, headdim_v), or (out, lse, None).
    """
    fn = "ipex_flash.distributed.llama3_flash_attn_varlen_func"
    group = resolve_group(fn, group)
    window = check_arguments(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    heads_k_stride, local_k_slice, dropout_p, softmax_scale, bool(causal),
                    window_size, softcap, alibi_slopes, sinks, group)
    agree(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, heads_k_stride, local_k_slice,
          bool(causal), window, softcap, sinks, group)
    problem = _Problem(group, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(),
                       max_seqlen_q, max_seqlen_k, heads_k_stride, local_k_slice,
                       resolve_scale(softmax_scale, q.shape[-1], fn), bool(causal), window,
                       float(softcap), alibi_slopes)
    out, lse = _Llama3Attention.apply(q, k.contiguous(), v.contiguous(), sinks, problem)
    return (out, natural_lse(lse), None) if return_attn_probs else out


def _unpack(fn, tensor, count, name):
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4 or tensor.shape[1] != count:
        raise ValueError(f"ipex_flash.distributed.{fn}: {name} must be (total_local, {count}, "
                         f"heads, headdim), got shape {tuple(getattr(tensor, 'shape', ()))}")
    return tensor.unbind(1)


def llama3_flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k, heads_k_stride, local_k_slice,
                                            dropout_p=0.0, softmax_scale=None, causal=False,
                                            window_size=(-1, -1), alibi_slopes=None,
                                            deterministic=False, return_attn_probs=False,
                                            group=None, *, softcap=0.0, sinks=None):
    """llama3_flash_attn_varlen_func with qkv (total_local, 3, nheads, headdim)."""
    q, k, v = _unpack("llama3_flash_attn_varlen_qkvpacked_func", qkv, 3, "qkv")
    return llama3_flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride,
        local_k_slice, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
        deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)


def llama3_flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, heads_k_stride, local_k_slice,
                                           dropout_p=0.0, softmax_scale=None, causal=False,
                                           window_size=(-1, -1), alibi_slopes=None,
                                           deterministic=False, return_attn_probs=False,
                                           group=None, *, softcap=0.0, sinks=None):
    """llama3_flash_attn_varlen_func with kv (total_local, 2, nheads_k, headdim)."""
    k, v = _unpack("llama3_flash_attn_varlen_kvpacked_func", kv, 2, "kv")
    return llama3_flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride,
        local_k_slice, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
        deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)
