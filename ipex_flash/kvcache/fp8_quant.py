"""FP8 KV caches: K and V stored as float8_e4m3fn or float8_e5m2 with descale factors
(flash-attn 3's k_descale, v_descale: the cache holds k / k_descale), queries and outputs in
float16 or bfloat16. The kernels read the FP8 elements and dequantise them in registers
(sycl_src/device/common/kv_quant.hpp); this module checks the arguments, gives the kernels the
descales as one float32 (batch, nheads_k) tensor each, and quantises appended tokens."""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
QUERY_DTYPES = (torch.float16, torch.bfloat16)


def is_fp8(t: Tensor) -> bool:
    return isinstance(t, Tensor) and t.dtype in FP8_DTYPES


def widened_query_dtype(out_dtype: Optional[torch.dtype]) -> torch.dtype:
    """The dtype an FP8 q is widened to (exactly) for the kernels: the output's (out='s, the
    model's) where it is 16-bit, else bfloat16 (flash-attn 3's output for an FP8 q)."""
    return out_dtype if out_dtype in QUERY_DTYPES else torch.bfloat16


def check_fp8_cache(fn: str, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> bool:
    """Whether the caches are FP8; if either is, both must be of one FP8 dtype and q 16-bit."""
    if not (is_fp8(k_cache) or is_fp8(v_cache)):
        return False
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"{fn}: k_cache ({k_cache.dtype}) and v_cache ({v_cache.dtype}) must have "
                        "one dtype")
    if q.dtype not in QUERY_DTYPES:
        raise TypeError(f"{fn}: with a {k_cache.dtype} cache, q must be torch.float16 or "
                        f"torch.bfloat16, got {q.dtype}")
    return True


def descales(fn: str, k_descale: Optional[Tensor], v_descale: Optional[Tensor], fp8: bool,
             batch: int, heads_kv: int, device: torch.device
             ) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """The descales as the kernels read them: float32 (batch, heads_kv), contiguous; 1 where
    not given. Each may be one value (per tensor) or (batch, heads_kv) (per sequence and K/V
    head). (None, None) for caches that are not FP8, which take no descales."""
    if not fp8:
        if k_descale is not None or v_descale is not None:
            raise ValueError(f"{fn}: k_descale and v_descale apply to float8_e4m3fn / "
                             "float8_e5m2 caches only")
        return None, None
    return tuple(torch.ones((batch, heads_kv), dtype=torch.float32, device=device) if t is None
                 else descale_table(fn, name, t, batch, heads_kv, device).contiguous()
                 for name, t in (("k_descale", k_descale), ("v_descale", v_descale)))


def descale_table(fn: str, name: str, t, batch: int, heads_kv: int,
                  device: torch.device) -> Tensor:
    """A descale as a (batch, heads_kv) float32 view, from one value or from that shape (vLLM's
    expanded views of one value included)."""
    if not isinstance(t, Tensor) or not t.is_floating_point():
        raise TypeError(f"{fn}: {name} must be a floating-point tensor, got "
                        f"{t.dtype if isinstance(t, Tensor) else type(t).__name__}")
    if t.device != device:
        raise ValueError(f"{fn}: {name} is on {t.device}, q on {device}")
    if t.numel() != 1 and tuple(t.shape) != (batch, heads_kv):
        raise ValueError(f"{fn}: {name} must hold one value (per tensor) or have shape "
                         f"(batch, nheads_k) = {(batch, heads_kv)}, got {tuple(t.shape)}")
    one_or_all = t.reshape(1, 1) if t.numel() == 1 else t
    return one_or_all.to(torch.float32).expand(batch, heads_kv)


def quantise(t: Tensor, descale: Tensor, dtype: torch.dtype) -> Tensor:
    """t (batch, seqlen, nheads_k, headdim) divided by its descale (batch, nheads_k) and
    rounded to dtype, saturating at dtype's largest finite value (NaN stays NaN)."""
    limit = torch.finfo(dtype).max
    return (t.float() / descale[:, None, :, None]).clamp(-limit, limit).to(dtype)
