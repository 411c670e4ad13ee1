"""flash-attn 3's qv: a second query scored against the values, as MLA's absorbed extend passes
it (q = the rope part against k_cache's rope columns, qv = the latent part against v_cache's
latent columns). The scores are q . k^T + qv . v^T, which is one product of the joined
queries [q, qv] with the joined keys [k, v]; the values stay v. The kernels take a qk head dim
apart from the value head dim (up to C.MAX_QK_HEAD_DIM / C.MAX_HEAD_DIM), so the call runs
them on the joined tensors.

The joined keys need no copy when the two caches are column ranges of one tensor, side by
side, as SGLang's MLA cache is (one (tokens, 1, 576) latent buffer: v_cache its first 512
columns, k_cache the 64 after them): then they are a view of that tensor's rows. Separate
caches are concatenated: a copy of both, every call."""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash._runtime import C

Tensor = torch.Tensor


def join_query_and_keys(fn: str, q: Tensor, qv, k_cache: Tensor, v_cache: Tensor, k, v,
                        k_descale, v_descale) -> tuple[Tensor, Tensor]:
    """(joined q, joined k_cache), whose product is q . k^T + qv . v^T. q (..., nheads,
    headdim), qv (..., nheads, headdim_v); caches (..., nheads_k, headdim or headdim_v)."""
    if not isinstance(qv, Tensor):
        raise TypeError(f"{fn}: qv must be a torch.Tensor (..., nheads, headdim_v), got "
                        f"{type(qv).__name__}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if k_cache.dim() != v_cache.dim() or k_cache.shape[:-1] != v_cache.shape[:-1]:
        raise ValueError(f"{fn}: with qv, k_cache and v_cache must have the same shape but the "
                         f"head dim, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    expected = (*q.shape[:-1], v_cache.shape[-1])
    if tuple(qv.shape) != expected:
        raise ValueError(f"{fn}: qv must have q's shape with v_cache's head dim, "
                         f"{expected}, got {tuple(qv.shape)}")
    if qv.dtype != q.dtype or qv.device != q.device:
        raise TypeError(f"{fn}: qv must have q's dtype and device ({q.dtype}, {q.device}), got "
                        f"({qv.dtype}, {qv.device})")
    if k is not None or v is not None:
        raise ValueError(f"{fn}: qv is not taken with an append (k, v): write the new tokens "
                         "into the caches first, then call without k and v")
    if k_descale is not v_descale and not _equal(k_descale, v_descale):
        # The joined keys carry one descale, applied to both products.
        raise ValueError(f"{fn}: with qv, k_descale and v_descale must be equal (one latent "
                         "cache has one scale) or both None")
    joined_dim = q.shape[-1] + qv.shape[-1]
    if joined_dim > C.MAX_QK_HEAD_DIM:
        raise ValueError(f"{fn}: q's and qv's head dims together ({q.shape[-1]} + "
                         f"{qv.shape[-1]}) must be <= {C.MAX_QK_HEAD_DIM}, the kernels' qk "
                         "head dim")
    joined = _side_by_side(v_cache, k_cache)
    if joined is not None:
        return torch.cat([qv, q], dim=-1), joined
    joined = _side_by_side(k_cache, v_cache)
    if joined is not None:
        return torch.cat([q, qv], dim=-1), joined
    return torch.cat([q, qv], dim=-1), torch.cat([k_cache, v_cache], dim=-1)


def _equal(a, b) -> bool:
    """Equal descales (read on the host: engines pass two expanded views of one scale)."""
    return (isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape
            and a.device == b.device and bool(torch.equal(a, b)))


def _side_by_side(first: Tensor, second: Tensor) -> Optional[Tensor]:
    """first's and second's columns as one view, where second's columns follow first's in
    the same rows of one tensor; None otherwise."""
    if (first.dtype != second.dtype or first.device != second.device
            or _strides(first) != _strides(second) or first.stride(-1) != 1
            or second.stride(-1) != 1
            or first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
            or second.storage_offset() != first.storage_offset() + first.shape[-1]):
        return None
    shape = (*first.shape[:-1], first.shape[-1] + second.shape[-1])
    return first.as_strided(shape, first.stride(), first.storage_offset())


def _strides(t: Tensor) -> tuple:
    """t's strides but those of its head dim and of dims of size 1 (a view gives these any
    stride: SGLang's (pages, page_size, 1, D) views of one buffer differ there)."""
    return tuple(st if n > 1 else None for n, st in zip(t.shape[:-1], t.stride()[:-1]))
