"""The ops behind flash-attn's API (flash_attn_interface.py), registered with torch.library
with fake implementations. Layout (batch, seq_len, heads, head_dim), or (total_tokens, heads,
head_dim) packed by cu_seqlens.

    ipex_flash::flash_attn_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
        dropout_p, dropout_seed) -> (out, softmax_lse)          differentiable in q, k, v
        (softmax_lse in the kernels' exp2 domain: launch.natural_lse gives flash-attn's)
    ipex_flash::flash_attn_backward(grad_out, q, k, v, out, softmax_lse, ...) -> (dq, dk, dv)
"""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash.ops import launch, score_grads, varlen_decode
from ipex_flash.ops.flash_attn_args import (
    BlockPositions, bhnd, check_call, contiguous_extras, flash_options, forward_outputs)
from ipex_flash.ops.validation import softmax_scale as resolve_scale

Tensor = torch.Tensor


def attend(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
           cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
           softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
           softcap: float, alibi_slopes: Optional[Tensor], dropout_p: float,
           dropout_seed: Optional[Tensor], sinks: Optional[Tensor] = None,
           positions: Optional[BlockPositions] = None) -> tuple[Tensor, Tensor]:
    """flash_attn_forward's work; positions: the call is a block of a larger attention
    (a ring's), whose dropout and ALiBi are drawn and measured at global positions."""
    fn = "ipex_flash.flash_attn_func"
    check_call(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left,
           window_right, softcap, alibi_slopes, dropout_p, dropout_seed, sinks)
    packed = cu_seqlens_q is not None
    q, k, v = (launch.with_contiguous_last_dim(t) for t in (q, k, v))
    cu_seqlens_q, cu_seqlens_k, alibi_slopes = contiguous_extras(cu_seqlens_q, cu_seqlens_k,
                                                                  alibi_slopes)
    out, lse = forward_outputs(q, v, packed)
    sinks32 = launch.float_sinks(sinks)  # read by address: referenced until the launch returns
    scale = resolve_scale(softmax_scale, q.shape[-1], fn)
    options = flash_options(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                            causal, window_left, window_right, softcap, alibi_slopes, dropout_p,
                            dropout_seed, sinks32, positions)
    if launch.nothing_to_attend(bhnd(q, packed), bhnd(k, packed)):
        launch.fill_unattended(out, lse, sinks32)
    elif packed and positions is None and varlen_decode.run(
            q, k, v, out, lse, flash_options(None, None, 0, 0, scale, causal, window_left,
                                             window_right, softcap, alibi_slopes, dropout_p,
                                             dropout_seed, sinks32),
            cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            backward_follows=launch.wants_backward(q, k, v)):
        pass  # a decode step: the decode kernel, the packed keys read as a cache
    elif packed:
        launch.flash_fwd(*(launch.view(bhnd(t, packed)) for t in (q, k, v, out)), launch.view(lse),
                      options, q.device)
    else:  # few query rows per K/V head take the decode kernel (never a block: positions)
        launch.run_forward(*(bhnd(t, packed) for t in (q, k, v, out)), lse, options,
                           backward_follows=launch.wants_backward(q, k, v))
    return out, lse


@torch.library.custom_op("ipex_flash::flash_attn_forward", mutates_args=(),
                         device_types=("cpu", "xpu"))
def flash_attn_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
                       cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                       softmax_scale: Optional[float], causal: bool, window_left: int,
                       window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                       dropout_p: float, dropout_seed: Optional[Tensor],
                       sinks: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    return attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                  dropout_p, dropout_seed, sinks)


@flash_attn_forward.register_fake
def _flash_attn_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             softmax_scale, causal, window_left, window_right, softcap,
                             alibi_slopes, dropout_p, dropout_seed, sinks=None):
    check_call("ipex_flash.flash_attn_func", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
           max_seqlen_k, window_left, window_right, softcap, alibi_slopes, dropout_p, dropout_seed,
           sinks, values=False)
    return forward_outputs(q, v, cu_seqlens_q is not None)


def attend_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float],
                    causal: bool, window_left: int, window_right: int, softcap: float,
                    alibi_slopes: Optional[Tensor], dropout_p: float,
                    dropout_seed: Optional[Tensor], positions: Optional[BlockPositions] = None
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """flash_attn_backward's work; positions as attend's."""
    packed = cu_seqlens_q is not None
    _check_grad_out(grad_out, out)
    q, k, v, out, grad_out = (launch.with_contiguous_last_dim(t) for t in (q, k, v, out, grad_out))
    cu_seqlens_q, cu_seqlens_k, alibi_slopes, lse = contiguous_extras(
        cu_seqlens_q, cu_seqlens_k, alibi_slopes, lse)
    # Packed K/V rows past cu_seqlens_k[-1] belong to no sequence: their gradient is zero.
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    delta = torch.empty_like(lse)
    options = flash_options(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             resolve_scale(softmax_scale, q.shape[-1]), causal, window_left,
                             window_right, softcap, alibi_slopes, dropout_p, dropout_seed,
                             positions=positions)
    if launch.nothing_to_attend(bhnd(q, packed), bhnd(k, packed)):
        return dq, dk, dv  # no row saw a key: nothing depends on q, k or v
    launch.flash_bwd(*(launch.view(bhnd(t, packed)) for t in (q, k, v, out, grad_out)),
                  launch.view(lse),
                  *(launch.view(bhnd(t, packed)) for t in (dq, dk, dv)), launch.view(delta), options,
                  q.device)
    return dq, dk, dv


@torch.library.custom_op("ipex_flash::flash_attn_backward", mutates_args=(),
                         device_types=("cpu", "xpu"))
def flash_attn_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                        lse: Tensor, cu_seqlens_q: Optional[Tensor],
                        cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                        softmax_scale: Optional[float], causal: bool, window_left: int,
                        window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                        dropout_p: float, dropout_seed: Optional[Tensor]
                        ) -> tuple[Tensor, Tensor, Tensor]:
    return attend_backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                           max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                           window_right, softcap, alibi_slopes, dropout_p, dropout_seed)


def _check_grad_out(grad_out: Tensor, out: Tensor) -> None:
    fn = "ipex_flash.flash_attn_func"
    if not isinstance(grad_out, torch.Tensor):
        raise TypeError(f"{fn}: grad_out must be a torch.Tensor, got {type(grad_out).__name__}")
    if grad_out.shape != out.shape:
        raise ValueError(f"{fn}: grad_out must have the output's shape {tuple(out.shape)}, got "
                         f"{tuple(grad_out.shape)}")
    if grad_out.dtype != out.dtype:
        raise TypeError(f"{fn}: grad_out must have the output's dtype {out.dtype}, got "
                        f"{grad_out.dtype}")


@flash_attn_backward.register_fake
def _flash_attn_backward_fake(grad_out, q, k, v, out, lse, *args):
    _check_grad_out(grad_out, out)
    return tuple(torch.empty_like(launch.with_contiguous_last_dim(t)) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
     window_left, window_right, softcap, alibi_slopes, dropout_p, dropout_seed, sinks) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                          dropout_seed, sinks)
    ctx.wants_sinks = sinks is not None and sinks.requires_grad
    ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                softcap)
    ctx.dropout_p = dropout_p
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_seed,
     sinks) = ctx.saved_tensors
    (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
     softcap) = ctx.args
    dq, dk, dv = torch.ops.ipex_flash.flash_attn_backward(
        grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, ctx.dropout_p,
        dropout_seed)
    d_sinks = _sinks_grad(sinks, grad_out, out, lse, cu_seqlens_q) if ctx.wants_sinks else None
    return (dq, dk, dv) + (None,) * 12 + (d_sinks,)


def _sinks_grad(sinks, grad_out, out, lse, cu_seqlens_q):
    """score_grads.sinks_grad in flash-attn's layouts: lse (B, Hq, Nq), or (Hq, total) packed,
    where rows past the last sequence belong to none."""
    delta = score_grads.output_delta(grad_out, out)  # (B, Nq, Hq) or (total, Hq)
    if cu_seqlens_q is None:
        return score_grads.sinks_grad(sinks, lse, delta.transpose(1, 2))
    end = int(cu_seqlens_q[-1])
    return score_grads.sinks_grad(sinks, lse[:, :end].unsqueeze(0),
                                  delta[:end].transpose(0, 1).unsqueeze(0))


flash_attn_forward.register_autograd(_backward, setup_context=_setup_context)
