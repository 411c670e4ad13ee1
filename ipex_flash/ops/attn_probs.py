"""return_attn_probs as flash-attn documents it: with dropout, S_dmask, the softmax
probabilities of every (query, key) pair, with the entries dropout dropped made negative
(flash-attn's tests read `S_dmask >= 0` as the keep-mask and `abs(S_dmask)` as the
probabilities); without dropout, None, as flash-attn (callers often ask only for the LSE).

The kernels never materialise the score matrix, so it is recomputed here with torch ops in
float32 from q, k and the kernel's own log-sum-exp (which includes any sinks): it costs
O(batch * heads * seqlen_q * seqlen_k) memory, and like flash-attn's is meant for tests and
small shapes."""
from __future__ import annotations

import math
from typing import Optional

import torch


Tensor = torch.Tensor
MAX_ELEMENTS = 1 << 28  # 1 GiB of float32: beyond it, return_attn_probs refuses


def _probabilities(q: Tensor, k: Tensor, lse: Tensor, scale: float, left: int, right: int,
                   softcap: float, slopes: Optional[Tensor]) -> Tensor:
    """(Hq, Nq, Nk) float32 probabilities of one sequence: q (Nq, Hq, D), k (Nk, Hkv, D),
    lse (Hq, Nq); masks aligned to the bottom-right, -1 bounds unbounded; slopes (Hq,)."""
    n_q, n_k = q.shape[0], k.shape[0]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    distance = (torch.arange(n_q, device=q.device)[:, None] + n_k - n_q
                - torch.arange(n_k, device=q.device)[None, :])
    if slopes is not None:
        scores = scores - slopes.float()[:, None, None] * distance.abs()
    visible = torch.ones_like(distance, dtype=torch.bool)
    if left >= 0:
        visible &= distance <= left
    if right >= 0:
        visible &= -distance <= right
    probs = torch.exp(scores - lse.float()[:, :, None])
    return torch.where(visible & torch.isfinite(lse)[:, :, None], probs, torch.zeros(()))


def attn_probs(fn: str, q: Tensor, k: Tensor, lse: Tensor, softmax_scale: Optional[float],
               causal: bool, left: int, right: int, softcap: float,
               alibi_slopes: Optional[Tensor], dropout_p: float, seed: Optional[Tensor],
               cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
               max_seqlen_q: int = 0, max_seqlen_k: int = 0) -> Tensor:
    """S_dmask (batch, nheads, seqlen_q, seqlen_k) of flash_attn_func's inputs, or zero-padded
    (batch, nheads, max_seqlen_q, max_seqlen_k) of flash_attn_varlen_func's."""
    packed = cu_seqlens_q is not None
    heads = q.shape[-2]
    batch = cu_seqlens_q.shape[0] - 1 if packed else q.shape[0]
    n_q, n_k = (max_seqlen_q, max_seqlen_k) if packed else (q.shape[1], k.shape[1])
    if batch * heads * n_q * n_k > MAX_ELEMENTS:
        raise ValueError(f"{fn}: return_attn_probs materialises ({batch}, {heads}, {n_q}, {n_k}) "
                         f"probabilities, more than {MAX_ELEMENTS} elements: use it on small "
                         f"shapes (it is meant for tests)")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    right = 0 if causal else right
    out = torch.zeros((batch, heads, n_q, n_k), dtype=torch.float32, device=q.device)
    starts_q = cu_seqlens_q.tolist() if packed else None
    starts_k = cu_seqlens_k.tolist() if packed else None
    for b in range(batch):
        if packed:
            rows_q, rows_k = slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])
            qb, kb, lse_b = q[rows_q], k[rows_k], lse[:, rows_q]
        else:
            qb, kb, lse_b = q[b], k[b], lse[b]
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        out[b, :, :qb.shape[0], :kb.shape[0]] = _probabilities(qb, kb, lse_b, scale, left, right,
                                                               softcap, slopes)
    if seed is not None:  # the kernels' own dropout pattern: (batch * heads, row, key) counters
        keep = torch.ops.ipex_flash.dropout_mask(seed, [batch, heads, n_q, n_k], float(dropout_p))
        out = torch.where(keep.bool(), out, -out)
    return out
