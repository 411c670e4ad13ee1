"""Arguments the serving engines pass beside flash-attn 2's, normalised to what the kernels take
or refused with an error that names them: vLLM's (out=, s_aux=, q/k/v descales as
(num_seqs, num_kv_heads) expanded views of one value, scheduler_metadata, fa_version,
num_splits, window_size as a list or None, softcap None) and flash-attn 3's / sgl-kernel's
(page_table, packed queries, pack_gqa, sm_margin).

Descales: with an FP8 cache the kernels apply k_descale and v_descale in registers, and an
FP8 q's q_descale folds into k_descale (q . k * qd * kd); with a 16-bit q, which nothing
quantised, q_descale must be 1. With a 16-bit cache the kernels carry no
descale code (common/kv_quant.hpp), so descales given anyway are applied here: q is multiplied by
q_descale * k_descale of its sequence and K/V head before the kernels, and the output by
v_descale after them; one-value descales are read on the host once per tensor and version, so
those of 1, which vLLM passes on every call, cost nothing."""
from __future__ import annotations

import ctypes
import weakref
from collections import OrderedDict
from typing import NamedTuple, Optional, Union

import torch

from ipex_flash.kvcache import fp8_quant
from ipex_flash.ops import launch_plans

Tensor = torch.Tensor
FA_VERSIONS = (2,)  # the kernels' semantics are flash-attn 2's; 3's extras are keywords here


def as_window(window_size):
    """vLLM passes its sliding window as a list [left, right] or None; the kernels take a
    tuple (check_window checks its entries)."""
    if window_size is None:
        return (-1, -1)
    if type(window_size) is list:
        return tuple(window_size)
    return window_size


def merged_sinks(fn: str, sinks: Optional[Tensor], s_aux: Optional[Tensor]) -> Optional[Tensor]:
    """s_aux is vLLM's name for the attention sinks (GPT-OSS)."""
    if sinks is not None and s_aux is not None:
        raise ValueError(f"{fn}: give the attention sinks as sinks or as s_aux, not both")
    return s_aux if sinks is None else sinks


def check_hints(fn: str, scheduler_metadata=None, fa_version=2, num_splits=0,
                pack_gqa=None, sm_margin=0, metadata_is_hint: bool = False) -> None:
    """Scheduling arguments: fa_version 2 (the semantics these kernels have); num_splits an
    int >= 0 (0 chooses); scheduler_metadata None, or with metadata_is_hint (flash-attn 3's
    kvcache call) any value, unused: the kernels plan their own splits; pack_gqa and
    sm_margin hints, unused."""
    if fa_version not in FA_VERSIONS:
        raise ValueError(f"{fn}: fa_version must be 2 (flash-attn 2's semantics, which these "
                         f"kernels implement), got {fa_version!r}")
    if scheduler_metadata is not None and not metadata_is_hint:
        raise ValueError(f"{fn}: scheduler_metadata must be None: the kernels plan their own "
                         "schedule (get_scheduler_metadata's result is not read)")
    if type(num_splits) is not int or num_splits < 0:
        raise ValueError(f"{fn}: num_splits must be an int >= 0 (0 chooses), got {num_splits!r}")
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise TypeError(f"{fn}: pack_gqa must be None or a bool, got {pack_gqa!r}")
    if type(sm_margin) is not int or sm_margin < 0:
        raise ValueError(f"{fn}: sm_margin must be an int >= 0, got {sm_margin!r}")


def check_out(fn: str, out, shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    """out=, which the call writes in place: refused before anything is written unless it has
    the output's shape, dtype and device and a contiguous last dimension (the kernels write
    rows as vectors); other strides, e.g. a slice of a larger buffer, are fine."""
    if not isinstance(out, Tensor):
        raise TypeError(f"{fn}: out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{fn}: out must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise TypeError(f"{fn}: out must have dtype {dtype}, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"{fn}: out is on {out.device}, q on {device}")
    if out.stride(-1) != 1 and out.shape[-1] > 1:
        raise ValueError(f"{fn}: out must have a contiguous last dimension (stride 1), got "
                         f"strides {out.stride()}")
    if out.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{fn}: out requires grad; a call writing into out= is not "
                         "differentiable (leave out=None for a backward)")


class Descaled(NamedTuple):
    q: Tensor
    k_descale: Optional[Tensor]  # for the kernels: FP8 caches only
    v_descale: Optional[Tensor]
    # what the output is multiplied by: one value, or (batch, heads_kv) float32
    out_scale: Union[float, Tensor, None]
    rows: Optional[Tensor]  # packed q's rows' sequences, where out_scale needs them

    def scaled(self, out: Tensor, in_place: bool) -> Tensor:
        """The output with out_scale applied (in place where the caller owns it)."""
        if self.out_scale is None:
            return out
        if isinstance(self.out_scale, float) or self.out_scale.dim() == 0:  # one value
            factor = self.out_scale
        else:
            factor = per_row(self.out_scale, out, self.rows)
        return out.mul_(factor) if in_place else out * factor


def apply_descales(fn: str, q: Tensor, cache_dtype: torch.dtype, q_descale, k_descale,
                   v_descale, batch: int, heads_kv: int,
                   cu_seqlens_q: Optional[Tensor] = None,
                   out_dtype: Optional[torch.dtype] = None) -> Descaled:
    """q as the kernels take it and the descales left for them or for the output (module
    docstring). q is (batch, seqlen, heads, D), or packed (total_q, heads, D) with
    cu_seqlens_q. An FP8 q (float8_e4m3fn, as flash-attn 3 takes it) needs an FP8 cache and
    is widened, exactly, to the output's dtype: out_dtype (that of out=, the model's) when it
    is float16 or bfloat16, else bfloat16 (flash-attn 3's output for an FP8 q)."""
    fp8_cache = cache_dtype in fp8_quant.FP8_DTYPES
    if fp8_quant.is_fp8(q):
        if not fp8_cache:
            raise TypeError(f"{fn}: q is {q.dtype}, which needs an FP8 cache (float8_e4m3fn "
                            f"or float8_e5m2); the cache is {cache_dtype}")
        q = q.to(fp8_quant.widened_query_dtype(out_dtype))
    elif q_descale is not None:
        _check_unquantised_q(fn, q_descale, batch, heads_kv, q.device)
        q_descale = None
    if q_descale is None and k_descale is None and v_descale is None:
        return Descaled(q, None, None, None, None)
    given = (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    if not fp8_cache and all(t is None or _one_value(t, q.device) for _, t in given):
        # One value each (vLLM's expanded views of one scale): scalar factors, no table and
        # no per-row lookup of sequences; read on the host once per scale tensor and version,
        # they cost nothing where they are 1 (vLLM's 16-bit caches) and one multiplication each
        # of q and the output elsewhere.
        values = [None if t is None else _host_value(t) for _, t in given]
        if all(v is not None or t is None for v, (_, t) in zip(values, given)):
            q_scale, k_scale, v_scale = (1.0 if v is None else v for v in values)
            if q_scale * k_scale != 1.0:
                q = q * (q_scale * k_scale)
            return Descaled(q, None, None, None if v_scale == 1.0 else v_scale, None)
        for t in (q_descale, k_descale):
            if t is not None:
                q = q * t[(0,) * t.dim()]
        v_scale = None if v_descale is None else v_descale[(0,) * v_descale.dim()]
        return Descaled(q, None, None, v_scale, None)
    table = {name: None if t is None
             else fp8_quant.descale_table(fn, name, t, batch, heads_kv, q.device)
             for name, t in given}
    qk = _product(table["q_descale"], table["k_descale"])
    if fp8_cache:
        return Descaled(q, qk, table["v_descale"], None, None)
    rows = None if cu_seqlens_q is None else sequence_of_rows(cu_seqlens_q, q.shape[0])
    if qk is not None:
        q = q * per_row(qk, q, rows)
    return Descaled(q, None, None, table["v_descale"], rows)


# One-value descales as host floats where reading them waits for a device (an XPU), by
# (tensor, address, version), least recently used last: vLLM passes the same scale tensors, as
# fresh expanded views, on every call of every step, three per layer.
_HOST_VALUES: "OrderedDict[tuple, tuple]" = OrderedDict()
_HOST_VALUES_KEPT = 4096


def _host_value(t: Tensor) -> Optional[float]:
    """t's one value as a float, None where it cannot be read (tracing, fake tensors). Read
    on every call where the device shares host memory (the CPU device: free); elsewhere once
    per tensor and version, so an in-place update is seen but a write that bypasses the version
    counter (through .data, or another tensor on the same storage) is not; inference tensors,
    which keep no version, and IPEX_FLASH_SYNC_CACHE_CHECKS=1 read every call."""
    if (torch.compiler.is_compiling() or t.device.type == "meta"
            or isinstance(t, torch._subclasses.FakeTensor)):
        return None
    if launch_plans.reads_host_memory(t.device):
        if t.dtype == torch.float32:  # (straight from host memory: a tensor op costs ~2 us)
            return ctypes.c_float.from_address(t.data_ptr()).value
        return float(t[(0,) * t.dim()])
    base = t if t._base is None else t._base
    if launch_plans.SYNC_CACHE_CHECKS or base.is_inference():
        return float(t[(0,) * t.dim()])
    key = (id(base), t.data_ptr(), base._version)
    known = _HOST_VALUES.get(key)
    if known is not None and known[0]() is base:
        _HOST_VALUES.move_to_end(key)
        return known[1]
    value = float(t[(0,) * t.dim()])
    _HOST_VALUES[key] = (weakref.ref(base), value)
    if len(_HOST_VALUES) > _HOST_VALUES_KEPT:
        _HOST_VALUES.popitem(last=False)
    return value


def _check_unquantised_q(fn: str, q_descale, batch: int, heads_kv: int,
                         device: torch.device) -> None:
    """q_descale says how an FP8 q was quantised; a 16-bit q was not, so it must be 1 (which
    engines pass for unquantised queries): any other value is refused rather than applied to
    a q it does not describe, or ignored."""
    if _one_value(q_descale, device):
        value = _host_value(q_descale)
    else:  # (checks its type, device and shape)
        table = fp8_quant.descale_table(fn, "q_descale", q_descale, batch, heads_kv, device)
        value = None if table.device.type == "meta" or torch.compiler.is_compiling() \
            else (1.0 if bool((table == 1).all()) else float("nan"))
    if value is not None and value != 1.0:
        shown = value if value == value else "values"
        raise ValueError(f"{fn}: q_descale applies to an FP8 q (float8_e4m3fn); with a 16-bit "
                         f"q it must be 1, got {shown} other than 1: pass the quantised q, or "
                         "q_descale=None")


def _one_value(t, device: torch.device) -> bool:
    """A floating-point descale on q's device holding one value, or an expanded view of one
    (strides all 0); anything else is checked by fp8_quant.descale_table."""
    return (isinstance(t, Tensor) and t.is_floating_point() and t.device == device
            and (t.numel() == 1 or (t.numel() > 1 and not any(t.stride()))))


def _product(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    if a is None or b is None:
        return b if a is None else a
    return a * b


def per_row(table: Tensor, like: Tensor, seq_of_row: Optional[Tensor]) -> Tensor:
    """A (batch, heads_kv) table as a factor that broadcasts over `like`'s rows and heads:
    like (batch, seqlen, heads, D), or packed (total_q, heads, D) with seq_of_row."""
    heads = like.shape[-2]
    per_head = table.repeat_interleave(heads // table.shape[1], dim=1)  # (batch, heads)
    if seq_of_row is None:
        return per_head[:, None, :, None].to(like.dtype)
    return per_head[seq_of_row][:, :, None].to(like.dtype)


def sequence_of_rows(cu_seqlens_q: Tensor, total_q: int) -> Tensor:
    """Each packed row's sequence, on the device, without reading cu_seqlens_q on the host
    (rows past the last sequence, which no kernel writes, are given the last one)."""
    rows = torch.arange(total_q, device=cu_seqlens_q.device, dtype=cu_seqlens_q.dtype)
    seq = torch.searchsorted(cu_seqlens_q[1:], rows, right=True)
    return seq.clamp_(max=max(cu_seqlens_q.shape[0] - 2, 0))
