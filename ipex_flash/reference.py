"""A float64 reference of attention, written from the definition, for tests and demos."""
from __future__ import annotations

import math
from typing import Optional

import torch


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) in float64 on the CPU for q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D), with
    SDPA's semantics (top-left causal mask, GQA by repeating each K/V head)."""
    q, k, v = (t.to("cpu", torch.float64) for t in (q, k, v))  # differentiable
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n_q, n_k = scores.shape[-2:]
        visible = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v
    return out, lse


def flash_visibility(n_q: int, n_k: int, causal: bool,
                     window_size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """flash-attn's masks, (n_q, n_k): each query's distance to each key (query i sits at key
    position i + n_k - n_q, bottom-right; > 0: the key is left of it) and whether it sees the
    key (within window (left, right), -1 unbounded; causal means right = 0)."""
    rows = torch.arange(n_q, dtype=torch.int64)[:, None]
    keys = torch.arange(n_k, dtype=torch.int64)[None, :]
    distance = rows + n_k - n_q - keys
    left, right = window_size
    if causal:
        right = 0
    visible = torch.ones(n_q, n_k, dtype=torch.bool)
    if left >= 0:
        visible &= distance <= left
    if right >= 0:
        visible &= -distance <= right
    return distance, visible


def flash_attn_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    keep: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) in float64 with flash-attn's semantics, written from its documentation, for
    q (B, Nq, Hq, D), k and v (B, Nk, Hkv, D):

    - query i sees keys j in [i + Nk - Nq - left, i + Nk - Nq + right] (bottom-right
      aligned; causal means right = 0; -1 means unbounded);
    - scores s = q.k * scale, then s = softcap * tanh(s / softcap) if softcap > 0, then
      s -= slope * |i + Nk - Nq - j| with ALiBi;
    - a row that sees no key gives output 0 and lse -inf;
    - keep (B, Hq, Nq, Nk), if given, is the dropout mask applied to the probabilities.
    """
    q, k, v = (t.to("cpu", torch.float64).transpose(1, 2) for t in (q, k, v))  # (B, H, N, D)
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    n_q, n_k = q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    distance, visible = flash_visibility(n_q, n_k, causal, window_size)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to("cpu", torch.float64)
        slopes = slopes[None, :, None, None] if slopes.dim() == 1 else slopes[:, :, None, None]
        scores = scores - slopes * distance.abs().double()
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None].clamp_min(-1e300)).nan_to_num(0.0)
    probs = torch.where(visible, probs, torch.zeros((), dtype=probs.dtype))
    if keep is not None:
        probs = probs * keep.double() / (1 - dropout_p)
    out = (probs @ v).transpose(1, 2)
    return out, lse


def sdpa_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """torch SDPA's output in float64 for q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D), from the
    definition: scores q.k * scale, then softcap * tanh(s / softcap), then the mask (bool:
    False hides; float: added) and the top-left causal mask; sinks (Hq,) join each row's
    denominator with no value; a row that sees nothing gives 0. Differentiable in every input.

    compute_dtype: every step in that dtype instead (float16, bfloat16: a plain implementation
    at the kernels' precision, whose error is the yardstick of tests' pass rule)."""
    q, k, v = (t.to("cpu", compute_dtype) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    n_q, n_k = scores.shape[-2:]
    visible = torch.ones(n_q, n_k, dtype=torch.bool)
    if is_causal:
        visible = visible.tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            visible = visible & attn_mask.cpu()
        else:
            scores = scores + attn_mask.to("cpu", compute_dtype)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.to("cpu", compute_dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
        v = torch.cat([v, torch.zeros_like(v[..., :1, :])], dim=-2)
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
    weights = torch.exp(scores - row_max)
    total = weights.sum(dim=-1, keepdim=True)
    probs = weights / torch.where(total > 0, total, torch.ones_like(total))
    return probs @ v
