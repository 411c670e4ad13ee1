"""Ulysses's kernel call with dropout (ulysses.py) as two torch ops,
ipex_flash::head_slice_attention and its backward. After the all-to-all a rank holds whole
sequences and a slice of the heads: its call is the whole problem but for the heads, so it is
placed (BlockPositions) at its first query head among all of them, every sequence at its own
index and positions 0. Dropout then draws, for each of its heads, the keep-mask one
process's flash_attn_func draws for that head. Ops rather than an autograd.Function, as
flash_attn_func's, so that torch.compile keeps the call in its graph.
"""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash.distributed._op_autograd import register_attention_autograd
from ipex_flash.ops import score_grads
from ipex_flash.ops.flash_attn import attend, attend_backward
from ipex_flash.ops.flash_attn_args import BlockPositions, forward_outputs

Tensor = torch.Tensor
# (device, first head, heads) -> its table: made once, since on an XPU each would be a copy
# to the device. A model has a handful of head layouts.
_TABLES: dict[tuple[str, int, int], BlockPositions] = {}


def head_positions(device: torch.device, head_offset: int, heads_total: int) -> BlockPositions:
    """The table of a call over whole sequences whose head 0 is global query head head_offset
    of heads_total: one entry (table_stride 0) shared by every sequence, all zeros."""
    key = (str(device), head_offset, heads_total)
    if key not in _TABLES:
        _TABLES[key] = BlockPositions.of([(0, 0, 0)], device, head_offset, heads_total)
    return _TABLES[key]


@torch.library.custom_op("ipex_flash::head_slice_attention", mutates_args=())
def head_slice_attention(q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor],
                         alibi_slopes: Optional[Tensor], dropout_seed: Optional[Tensor],
                         scale: float, causal: bool, window_left: int, window_right: int,
                         softcap: float, dropout_p: float, head_offset: int,
                         heads_total: int) -> tuple[Tensor, Tensor]:
    """(out, lse in the kernels' exp2 domain (B, H, N)): flash_attn_func's forward over
    (B, N, H, D) head slices, whose head 0 is global head head_offset of heads_total. With
    dropout the general kernel runs (never the decode one), which the backward mirrors."""
    return attend(q, k, v, None, None, 0, 0, scale, causal, window_left, window_right,
                  softcap, alibi_slopes, dropout_p, dropout_seed, sinks,
                  head_positions(q.device, head_offset, heads_total))


@head_slice_attention.register_fake
def _head_slice_attention_fake(q, k, v, *args):
    return forward_outputs(q, v, False)


@torch.library.custom_op("ipex_flash::head_slice_attention_backward", mutates_args=())
def head_slice_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor,
                                  out: Tensor, lse: Tensor, sinks: Optional[Tensor],
                                  alibi_slopes: Optional[Tensor],
                                  dropout_seed: Optional[Tensor], scale: float, causal: bool,
                                  window_left: int, window_right: int, softcap: float,
                                  dropout_p: float, head_offset: int, heads_total: int,
                                  wants_sinks: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d sinks of these heads, or an empty tensor without wants_sinks)."""
    dq, dk, dv = attend_backward(
        grad_out, q, k, v, out, lse, None, None, 0, 0, scale, causal, window_left,
        window_right, softcap, alibi_slopes, dropout_p, dropout_seed,
        head_positions(q.device, head_offset, heads_total))
    d_sinks = q.new_empty(0, dtype=torch.float32)
    if wants_sinks:  # as flash_attn_func's: the sinks have no value, only a denominator
        delta = score_grads.output_delta(grad_out, out)  # (B, N, H)
        d_sinks = score_grads.sinks_grad(sinks, lse, delta.transpose(1, 2))
    return dq, dk, dv, d_sinks


@head_slice_attention_backward.register_fake
def _head_slice_attention_backward_fake(grad_out, q, k, v, out, lse, sinks, *args):
    wants_sinks = args[-1]
    d_sinks = (sinks.new_empty(sinks.shape, dtype=torch.float32) if wants_sinks
               else q.new_empty(0, dtype=torch.float32))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), d_sinks


register_attention_autograd(head_slice_attention,
                            torch.ops.ipex_flash.head_slice_attention_backward)
