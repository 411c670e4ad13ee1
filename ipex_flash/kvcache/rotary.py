"""Rotary position embedding as flash_attn_with_kvcache applies it to q and the new k: the
first rotary_dim features of each head rotated by the angles whose cosines and sines are rows
of rotary_cos and rotary_sin (seqlen_ro, rotary_dim / 2), at per-token positions.

The rotation runs as a few torch ops in float32 before the attention kernel: it touches only
the new tokens (a decode step's one row per sequence), next to which the kernel's pass over
the cache dominates."""
from __future__ import annotations

import torch

Tensor = torch.Tensor


def check_rotary(fn: str, cos, sin, head_dim: int, has_new_keys: bool) -> int:
    """rotary_dim, after checking the tables; 0 without rotary."""
    if cos is None and sin is None:
        return 0
    if cos is None or sin is None:
        raise ValueError(f"{fn}: rotary_cos and rotary_sin must be given together")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point():
            raise ValueError(f"{fn}: {name} must be a float (seqlen_ro, rotary_dim / 2) tensor")
    if cos.shape != sin.shape:
        raise ValueError(f"{fn}: rotary_sin must have rotary_cos's shape {tuple(cos.shape)}, "
                         f"got {tuple(sin.shape)}")
    rotary_dim = 2 * cos.shape[1]
    if not 0 < rotary_dim <= head_dim:
        raise ValueError(f"{fn}: rotary_dim (2 * rotary_cos.shape[1] = {rotary_dim}) must be in "
                         f"[2, headdim = {head_dim}]")
    if not has_new_keys:
        raise ValueError(f"{fn}: rotary_cos/rotary_sin rotate the new k: k and v must be given")
    return rotary_dim


def apply_rotary(fn: str, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor,
                 interleaved: bool) -> Tensor:
    """x (batch, seqlen, heads, head_dim) rotated at positions (batch, seqlen) (int64 rows of
    cos and sin); a new tensor in x's dtype. interleaved: features (2i, 2i + 1) form pair i
    (GPT-J); otherwise features i and i + rotary_dim / 2 (GPT-NeoX)."""
    if positions.numel() and int(positions.max()) >= cos.shape[0]:
        raise ValueError(f"{fn}: rotary_cos/rotary_sin have {cos.shape[0]} rows, the tokens' "
                         f"positions reach {int(positions.max())}")
    half = cos.shape[1]
    c = cos.float()[positions][:, :, None, :]  # (batch, seqlen, 1, half)
    s = sin.float()[positions][:, :, None, :]
    rot = x[..., :2 * half].float()
    if interleaved:
        even, odd = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2)
    else:
        first, second = rot[..., :half], rot[..., half:]
        rotated = torch.cat((first * c - second * s, first * s + second * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)


def rotate_new_tokens(fn, q, k, cos, sin, seqlens, interleaved, causal, window_size):
    """q and the new k rotated as flash-attn does: k's token i at position cache_seqlens + i;
    q's likewise when the mask is causal or local, else every q token at cache_seqlens."""
    offsets = seqlens.long()[:, None]
    k_positions = offsets + torch.arange(k.shape[1], device=k.device)
    local = causal or tuple(window_size) != (-1, -1)
    q_positions = (offsets + torch.arange(q.shape[1], device=q.device) if local
                   else offsets.expand(-1, q.shape[1]))
    return (apply_rotary(fn, q, cos, sin, q_positions, interleaved),
            apply_rotary(fn, k, cos, sin, k_positions, interleaved))
