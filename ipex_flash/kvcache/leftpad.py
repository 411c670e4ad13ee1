"""cache_leftpad of flash_attn_with_kvcache (flash-attn 2.8): sequence b's keys are cache rows
cache_leftpad[b] .. cache_seqlens[b] (+ the appended tokens). The kernels take it as each
sequence's first key row (AttentionOptions.k_start), so masks, ALiBi distances and the key
count are those of the keys after the pad; appends and rotary positions stay at the cache's
absolute row cache_seqlens[b] + i, as flash-attn's kernel places them."""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor


def check_leftpad_combination(fn: str, cache_leftpad, block_table) -> None:
    """flash-attn refuses a paged cache with cache_leftpad; so does this."""
    if cache_leftpad is not None and block_table is not None:
        raise ValueError(f"{fn}: cache_leftpad and block_table (a paged KV cache) cannot be "
                         f"used together")


def check_leftpad(fn: str, cache_leftpad: Optional[Tensor], batch: int, device: torch.device,
                  cache_seqlens: Optional[Tensor] = None) -> None:
    """dtype, shape and device of cache_leftpad (None passes), and with cache_seqlens its
    values."""
    if cache_leftpad is None:
        return
    if not isinstance(cache_leftpad, torch.Tensor) or cache_leftpad.dtype != torch.int32:
        kind = cache_leftpad.dtype if isinstance(cache_leftpad, torch.Tensor) else type(cache_leftpad).__name__
        raise TypeError(f"{fn}: cache_leftpad must be an int32 tensor of shape ({batch},), got {kind}")
    if tuple(cache_leftpad.shape) != (batch,):
        raise ValueError(f"{fn}: cache_leftpad must have shape ({batch},), got "
                         f"{tuple(cache_leftpad.shape)}")
    if cache_leftpad.device != device:
        raise ValueError(f"{fn}: cache_leftpad is on {cache_leftpad.device}, q on {device}")
    if cache_seqlens is not None:
        _check_values(fn, cache_leftpad, cache_seqlens)


def _check_values(fn: str, cache_leftpad: Optional[Tensor], cache_seqlens: Tensor) -> None:
    """0 <= cache_leftpad[b] <= cache_seqlens[b] (read from the device, as cache_seqlens'
    own range check does)."""
    if cache_leftpad is None or cache_leftpad.device.type == "meta" or not cache_leftpad.numel():
        return
    bad = (cache_leftpad < 0) | (cache_leftpad > cache_seqlens)
    if bool(bad.any()):
        raise ValueError(f"{fn}: cache_leftpad must satisfy 0 <= cache_leftpad[b] <= "
                         f"cache_seqlens[b], got cache_leftpad {cache_leftpad.tolist()} and "
                         f"cache_seqlens {cache_seqlens.tolist()}")


def keys_attended(seqlens_k: Tensor, cache_leftpad: Optional[Tensor]) -> tuple[Tensor, int, int]:
    """The keys each sequence attends to (B,), their most (it sizes the launch) and their total
    (it sizes the matrix forward's K/V pack: launch.pack_keys_used), read in one transfer."""
    # Clamped: a pack offset must never go back (a pad past the keys means no key).
    keys = seqlens_k if cache_leftpad is None else (seqlens_k - cache_leftpad).clamp_min(0)
    if not keys.numel():
        return keys, 0, 0
    most, total = torch.stack([keys.max().long(), keys.sum()]).tolist()
    return keys, most, total
