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
