"""The forward of SDPA's semantics (B, H, N, D): its options, outputs, checks and the call of
the kernels, shared by its op (ops/attention.py, which registers it with torch.library) and
its launch plans (ops/fast_path.py)."""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash._runtime import C
from ipex_flash.ops.launch import (
    attention_outputs, dropout_params, fill_unattended, float_sinks, nothing_to_attend,
    run_forward, view, wants_backward, with_contiguous_last_dim)
from ipex_flash.ops.validation import (
    check_attention_inputs, check_attn_mask, check_dropout, check_sinks, check_softcap,
    softmax_scale)

Tensor = torch.Tensor
_FN = "ipex_flash.attention"


def sdpa_options(q: Tensor, causal: bool, scale: Optional[float], dropout_p: float,
                 dropout_seed: Optional[Tensor], attn_mask: Optional[Tensor] = None,
                 sinks: Optional[Tensor] = None, softcap: float = 0.0) -> "C.AttentionOptions":
    """SDPA's semantics: the causal mask is top-left aligned (row i sees keys 0..i), and ANDed
    with attn_mask when both are given. sinks must already be float32 and contiguous."""
    plain = dropout_p == 0.0 and softcap == 0.0 and attn_mask is None and sinks is None
    key = (causal, scale, q.shape[-1])
    if plain and key in _PLAIN_OPTIONS:  # never modified once made
        return _PLAIN_OPTIONS[key]
    options = C.AttentionOptions()
    options.scale = softmax_scale(scale, q.shape[-1])
    options.mask = C.MaskParams(-1, 0 if causal else -1, False)  # window left, right; top-left
    options.dropout = dropout_params(dropout_p, dropout_seed)
    options.softcap = softcap
    if attn_mask is not None:
        options.attn_mask = view(attn_mask)
    if sinks is not None:
        options.sinks = view(sinks)
    if plain and len(_PLAIN_OPTIONS) < 64:
        _PLAIN_OPTIONS[key] = options
    return options


# The options of calls without mask, sinks, softcap or dropout, by (causal, scale, head dim):
# building them is a visible part of a small call's host time.
_PLAIN_OPTIONS: dict = {}


def forward_outputs(q: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """out in q's layout with v's head dim (a (B, N, H, D) tensor transposed to (B, H, N, D)
    gets the same dimension order back), lse (B, Hq, Nq) float32."""
    return attention_outputs(q, v.shape[-1], q.shape[:3])


def attention_forward_impl(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                           scale: Optional[float] = None, dropout_p: float = 0.0,
                           dropout_seed: Optional[Tensor] = None, deterministic: bool = False,
                           attn_mask: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
                           softcap: float = 0.0) -> tuple[Tensor, Tensor]:
    # deterministic only matters to the backward; it is an argument here so that autograd
    # can hand it on. attn_mask is a (B, Hq, Nq, Nk) view, read in place through its strides.
    check_forward(q, k, v, scale, dropout_p, dropout_seed, attn_mask, sinks, softcap)
    q, k, v = (with_contiguous_last_dim(t) for t in (q, k, v))
    out, lse = forward_outputs(q, v)
    sinks = float_sinks(sinks)
    if nothing_to_attend(q, k):
        fill_unattended(out, lse, sinks)
        return out, lse
    run_forward(q, k, v, out, lse,
                sdpa_options(q, causal, scale, dropout_p, dropout_seed, attn_mask, sinks,
                             softcap),
                backward_follows=wants_backward(q, k, v))
    return out, lse


def check_forward(q, k, v, scale, dropout_p, dropout_seed, attn_mask, sinks, softcap) -> None:
    check_attention_inputs(_FN, q, k, v, scale)
    check_softcap(_FN, softcap)
    check_dropout(_FN, dropout_p, dropout_seed)
    check_attn_mask(_FN, attn_mask, q, k)
    check_sinks(_FN, sinks, q)
