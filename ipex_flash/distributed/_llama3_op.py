"""llama3_flash_attn_varlen_func's work as two torch ops, ipex_flash::llama3_attention and its
backward, so that torch.compile keeps a call whole in its graph (no graph break): the ops take
the group by name and local_k_slice as two ints, and run eagerly inside: the agreement between
ranks (learned once, _llama3_checks.agree), the all-gathers, kernels and reduce-scatters
(_llama3_engine.py). Their fake implementations give the outputs' shapes for tracing.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.distributed.distributed_c10d import _resolve_process_group

from ipex_flash.distributed._llama3_checks import agree
from ipex_flash.distributed._llama3_engine import Llama3Problem, llama3_backward, llama3_forward
from ipex_flash.distributed._op_autograd import register_attention_autograd
from ipex_flash.ops import score_grads

Tensor = torch.Tensor
FN = "ipex_flash.distributed.llama3_flash_attn_varlen_func"


def _problem(q, k, v, sinks, cu_q, cu_k, max_q, max_k, stride, k_start, k_stop, group_name,
             scale, causal, window_left, window_right, softcap, alibi, dropout_p,
             dropout_seed) -> Llama3Problem:
    group = _resolve_process_group(group_name)
    k_slice, window = slice(k_start, k_stop), (window_left, window_right)
    positions = agree(FN, q, k, v, cu_q, cu_k, stride, k_slice, causal, window, softcap,
                      sinks, group, dropout_p, alibi)
    return Llama3Problem(group, cu_q.contiguous(), cu_k.contiguous(), max_q, max_k, stride,
                         k_slice, scale, causal, window, softcap, alibi, dropout_p,
                         dropout_seed, positions)


@torch.library.custom_op("ipex_flash::llama3_attention", mutates_args=())
def llama3_attention(q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor],
                     cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, heads_k_stride: int, k_start: int, k_stop: int,
                     group_name: str, scale: float, causal: bool, window_left: int,
                     window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                     dropout_p: float, dropout_seed: Optional[Tensor],
                     backward_follows: bool) -> tuple[Tensor, Tensor]:
    """(out (total_local, H, Dv), lse (H, total_local) float32 in the kernels' exp2 domain)
    of this rank's queries; the arguments already checked on this rank (llama3.py)."""
    problem = _problem(q, k, v, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       heads_k_stride, k_start, k_stop, group_name, scale, causal, window_left,
                       window_right, softcap, alibi_slopes, dropout_p, dropout_seed)
    return llama3_forward(problem, q, k.contiguous(), v.contiguous(), sinks, backward_follows)


@llama3_attention.register_fake
def _llama3_attention_fake(q, k, v, sinks, *args):
    return (q.new_empty((q.shape[0], q.shape[1], v.shape[-1])),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


@torch.library.custom_op("ipex_flash::llama3_attention_backward", mutates_args=())
def llama3_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                              lse: Tensor, sinks: Optional[Tensor], cu_seqlens_q: Tensor,
                              cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                              heads_k_stride: int, k_start: int, k_stop: int,
                              group_name: str, scale: float, causal: bool, window_left: int,
                              window_right: int, softcap: float,
                              alibi_slopes: Optional[Tensor], dropout_p: float,
                              dropout_seed: Optional[Tensor], wants_sinks: bool
                              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, this rank's part of d sinks, or an empty tensor without wants_sinks)."""
    problem = _problem(q, k, v, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       heads_k_stride, k_start, k_stop, group_name, scale, causal, window_left,
                       window_right, softcap, alibi_slopes, dropout_p, dropout_seed)
    grad_out = grad_out.contiguous()
    dq, dk, dv = llama3_backward(problem, grad_out, q, k.contiguous(), v.contiguous(), out, lse)
    d_sinks = q.new_empty(0, dtype=torch.float32)
    if wants_sinks:
        # This rank's part, from its own query rows: summed over the group like any
        # replicated parameter's gradient (DDP/FSDP, or an all_reduce).
        delta = score_grads.output_delta(grad_out, out)  # (total, H)
        d_sinks = score_grads.sinks_grad(sinks, lse.unsqueeze(0),
                                         delta.transpose(0, 1).unsqueeze(0))
    return dq, dk, dv, d_sinks


@llama3_attention_backward.register_fake
def _llama3_attention_backward_fake(grad_out, q, k, v, out, lse, sinks, *args):
    wants_sinks = args[-1]
    d_sinks = (sinks.new_empty(sinks.shape) if wants_sinks
               else q.new_empty(0, dtype=torch.float32))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), d_sinks


register_attention_autograd(llama3_attention, torch.ops.ipex_flash.llama3_attention_backward,
                            forward_only=1)
