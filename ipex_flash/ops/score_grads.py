"""Gradients of the two score inputs the kernels take besides q, k and v, computed from what
the forward kept (out, LSE) without another attention pass:

    sinks:  a sink's probability in row i is exp(sink - lse_i) and its value is 0, so
            d loss / d sink = -sum_i exp(sink - lse_i) * delta_i,  delta_i = rowsum(dO * O)_i
    mask:   an additive mask enters the scores as s += mask, so d loss / d mask = dS,
            dS_ij = P_ij * (dP_ij - sum_k P_ik dP_ik),  P_ij = exp(s_ij - lse_i),  dP = dO . V^T

lse is the LSE as the kernels keep it, in their exp2 domain (launch.natural_lse); the
formulas above take it in the natural log. The mask's gradient is a full (B, Hq, Nq, Nk) tensor (autograd then sums it over the mask's
broadcast dimensions); it is built here in blocks of query rows, in float32, so its only
large allocation is the result itself. Only learned biases (masks that require grad) pay it.
"""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash.ops.launch import natural_lse

Tensor = torch.Tensor
_ROWS_PER_BLOCK = 256


def output_delta(grad_out: Tensor, out: Tensor) -> Tensor:
    """delta = rowsum(dO * O), (B, Hq, Nq) float32."""
    return (grad_out.float() * out.float()).sum(-1)


def sinks_grad(sinks: Tensor, lse: Tensor, delta: Tensor) -> Tensor:
    """d loss / d sinks, (Hq,) in the sinks' dtype."""
    prob = torch.exp(sinks.float().view(1, -1, 1) - natural_lse(lse))
    return -(prob * delta).sum(dim=(0, 2)).to(sinks.dtype)


def attn_mask_grad(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, lse: Tensor,
                   attn_mask: Tensor, causal: bool, scale: float,
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
        lse_rows = natural_lse(lse[:, :, rows]).unsqueeze(-1)
        # Rows that saw no key have lse -inf: their probabilities are 0, not NaN.
        prob = torch.where(torch.isinf(lse_rows), torch.zeros_like(scores),
                           torch.exp(scores - lse_rows))
        dprob = grad_out[:, :, rows].float() @ v32.transpose(-1, -2)
        # The row term sum_j P_ij dP_ij from these P and dP rather than delta = rowsum(dO * O):
        # O was rounded to the input dtype, and dO . (O - P V) would enter every dS of the row
        # (a broadcast mask's gradient, the sum of them all, is exactly 0 but came out at
        # 4e-2 in bfloat16). So each row of dS sums to 0 up to float32 rounding.
        row_term = (prob * dprob).sum(-1, keepdim=True)
        grad[:, :, rows] = prob * (dprob - row_term)
    return _summed_over_broadcast(grad, attn_mask)


def _summed_over_broadcast(grad: Tensor, attn_mask: Tensor) -> Tensor:
    """The float32 gradient in the mask's dtype, for autograd to sum over the mask's broadcast
    (stride-0) dimensions. Autograd would sum it there in the mask's dtype, adding up to
    Nq * Nk rounded terms (a float16 (1, 1) mask's gradient, exactly 0, came out at 4e-3); so
    the sum is taken here in float32 and rounded once, and autograd gets it in the first place
    of each broadcast run with zeros elsewhere: its own sum then adds only exact zeros."""
    broadcast = [d for d in range(grad.dim()) if attn_mask.stride(d) == 0 and grad.shape[d] > 1]
    if not broadcast:
        return grad.to(attn_mask.dtype)
    first = tuple(slice(0, 1) if d in broadcast else slice(None) for d in range(grad.dim()))
    summed = torch.zeros(grad.shape, dtype=attn_mask.dtype, device=grad.device)
    summed[first] = grad.sum(dim=broadcast, keepdim=True).to(attn_mask.dtype)
    return summed
