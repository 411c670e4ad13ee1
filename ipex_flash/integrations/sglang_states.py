"""sgl_kernel.merge_state_v2: two partial attention results over disjoint key sets merged
into the result over their union, as SGLang's cascade attention merges its prefix and its
draft tokens. Each part is an output v (tokens, heads, headdim) and its log-sum-exp s
(tokens, heads), float32 in natural log (the lse of flash_attn_with_kvcache, transposed):

    merged s = log(e^s_a + e^s_b),  merged v = (e^s_a v_a + e^s_b v_b) / e^merged s

in float32, the weights taken relative to the larger lse so neither exponential overflows.
"""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor
_FN = "ipex_flash.integrations.sglang.merge_state_v2"
_OUTPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def merge_state_v2(v_a: Tensor, s_a: Tensor, v_b: Tensor, s_b: Tensor,
                   v_merged: Optional[Tensor] = None,
                   s_merged: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """(v_merged, s_merged), written into v_merged and s_merged where given (module
    docstring). A part whose lse is not finite (+inf, NaN, -inf: it saw no key) weighs
    nothing, as in sgl-kernel; a row where neither part saw a key gives v 0 and s -inf
    (sgl-kernel's kernel gives NaN there)."""
    _check(v_a, s_a, v_b, s_b, v_merged, s_merged)
    s_a, s_b = (torch.where(torch.isfinite(s), s.float(), float("-inf")) for s in (s_a, s_b))
    top = torch.maximum(s_a, s_b)
    seen = torch.isfinite(top)
    top = torch.where(seen, top, torch.zeros((), dtype=top.dtype, device=top.device))
    w_a, w_b = torch.exp(s_a - top), torch.exp(s_b - top)  # (0 where a part saw no key)
    total = w_a + w_b
    norm = torch.where(seen, total, torch.ones((), dtype=total.dtype, device=total.device))
    merged = (v_a.float() * (w_a / norm)[..., None] + v_b.float() * (w_b / norm)[..., None])
    lse = torch.where(seen, torch.log(norm) + top,
                      torch.full((), float("-inf"), dtype=top.dtype, device=top.device))
    if v_merged is None:
        v_merged = merged.to(v_a.dtype)
    else:
        v_merged.copy_(merged)
    if s_merged is None:
        s_merged = lse
    else:
        s_merged.copy_(lse)
    return v_merged, s_merged


def _check(v_a, s_a, v_b, s_b, v_merged, s_merged) -> None:
    for name, t in (("v_a", v_a), ("s_a", s_a), ("v_b", v_b), ("s_b", s_b)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{_FN}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if v_a.dim() != 3 or v_a.shape != v_b.shape:
        raise ValueError(f"{_FN}: v_a and v_b must have one shape (tokens, heads, headdim), got "
                         f"{tuple(v_a.shape)} and {tuple(v_b.shape)}")
    if v_a.dtype not in _OUTPUT_DTYPES or v_b.dtype != v_a.dtype:
        raise TypeError(f"{_FN}: v_a and v_b must have one dtype of float32, float16 or "
                        f"bfloat16, got {v_a.dtype} and {v_b.dtype}")
    for name, s in (("s_a", s_a), ("s_b", s_b)):
        if tuple(s.shape) != tuple(v_a.shape[:2]):
            raise ValueError(f"{_FN}: {name} must be (tokens, heads) = {tuple(v_a.shape[:2])}, "
                             f"got {tuple(s.shape)}")
        if not s.is_floating_point():
            raise TypeError(f"{_FN}: {name} must be floating point, got {s.dtype}")
    for name, t in (("v_b", v_b), ("s_a", s_a), ("s_b", s_b)):
        if t.device != v_a.device:
            raise ValueError(f"{_FN}: {name} is on {t.device}, v_a on {v_a.device}")
    for name, t, shape, dtype in (("v_merged", v_merged, v_a.shape, v_a.dtype),
                                  ("s_merged", s_merged, v_a.shape[:2], torch.float32)):
        if t is None:
            continue
        if not isinstance(t, Tensor) or tuple(t.shape) != tuple(shape) or t.dtype != dtype \
                or t.device != v_a.device:
            raise ValueError(f"{_FN}: {name} must be a {dtype} tensor of shape {tuple(shape)} "
                             f"on {v_a.device}, got "
                             + (f"{t.dtype} {tuple(t.shape)} on {t.device}"
                                if isinstance(t, Tensor) else type(t).__name__))
