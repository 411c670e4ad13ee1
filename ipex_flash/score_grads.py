"""Gradients of the two score inputs the kernels take besides q, k and v, computed from what
the forward kept (out, LSE) without another attention pass:

    sinks:  a sink's probability in row i is exp(sink - lse_i) and its value is 0, so
            d loss / d sink = -sum_i exp(sink - lse_i) * delta_i,  delta_i = rowsum(dO * O)_i
    mask:   an additive mask enters the scores as s += mask, so d loss / d mask = dS,
            dS_ij = P_ij * (dP_ij - delta_i),  P_ij = exp(s_ij - lse_i),  dP = dO . V^T

The mask's gradient is a full (B, Hq, Nq, Nk) tensor (autograd then sums it over the mask's
broadcast dimensions); it is built here in blocks of query rows, in float32, so its only
large allocation is the result itself. Only learned biases (masks that require grad) pay it.
"""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor
_ROWS_PER_BLOCK = 256


def output_delta(grad_out: Tensor, out: Tensor) -> Tensor:
    """delta = rowsum(dO * O), (B, Hq, Nq) float32."""
    return (grad_out.float() * out.float()).sum(-1)


def sinks_grad(sinks: Tensor, lse: Tensor, delta: Tensor) -> Tensor:
    """d loss / d sinks, (Hq,) in the sinks' dtype."""
    prob = torch.exp(sinks.float().view(1, -1, 1) - lse)
    return -(prob * delta).sum(dim=(0, 2)).to(sinks.dtype)


def attn_mask_grad(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, lse: Tensor,
                   delta: Tensor, attn_mask: Tensor, causal: bool, scale: float,
                   softcap: Optional[float] = None) -> Tensor:
    """d loss / d attn_mask for an additive mask viewed as (B, Hq, Nq, Nk) (top-left causal
    as in SDPA); returned in that shape and the mask's dtype."""
    if softcap:
        raise NotImplementedError("ipex_flash: the gradient of attn_mask together with softcap "
                                  "is not implemented")
    groups = q.shape[1] // k.shape[1]
    k32, v32 = (t.float().repeat_interleave(groups, dim=1) for t in (k, v))
    len_q, len_k = q.shape[2], k.shape[2]
    grad = torch.empty(attn_mask.shape, dtype=torch.float32, device=q.device)
    for r0 in range(0, len_q, _ROWS_PER_BLOCK):
        rows = slice(r0, min(r0 + _ROWS_PER_BLOCK, len_q))
        scores = scale * (q[:, :, rows].float() @ k32.transpose(-1, -2)) + attn_mask[:, :, rows]
        if causal:
            row_ids = torch.arange(rows.start, rows.stop, device=q.device).view(-1, 1)
            hidden = torch.arange(len_k, device=q.device).view(1, -1) > row_ids
            scores = scores.masked_fill(hidden, float("-inf"))
        lse_rows = lse[:, :, rows].unsqueeze(-1)
        # Rows that saw no key have lse -inf: their probabilities are 0, not NaN.
        prob = torch.where(torch.isinf(lse_rows), torch.zeros_like(scores),
                           torch.exp(scores - lse_rows))
        dprob = grad_out[:, :, rows].float() @ v32.transpose(-1, -2)
        grad[:, :, rows] = prob * (dprob - delta[:, :, rows].unsqueeze(-1))
    return grad.to(attn_mask.dtype)
