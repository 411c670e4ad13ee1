"""The argument checks of every entry point, shared by the real and the fake (meta)
implementations of every op, so bad input fails the same way eagerly, under torch.compile and on
every device (SDPA's contract: sdpa_contract.py). Checks that route rather than raise return the
exception (the *_error functions)."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ipex_flash._runtime import C
from ipex_flash.ops.checked_offsets import checked_offsets as _checked_offsets

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# meta: shape-only tensors, which the fake implementations serve.
SUPPORTED_DEVICE_TYPES = ("cpu", "xpu", "meta")
# The kernels' head dims (sycl_src/host/variants/kernel_variant.hpp): v's (and the output's) up
# to MAX_HEAD_DIM, q's and k's up to MAX_QK_HEAD_DIM (MLA: a 512-column latent and 64 rope
# columns against the latent).
MAX_HEAD_DIM = C.MAX_HEAD_DIM
MAX_QK_HEAD_DIM = C.MAX_QK_HEAD_DIM


def raise_error(error: Optional[Exception]) -> None:
    if error is not None:
        raise error


def tensor_error(fn: str, name: str, t) -> Optional[TypeError]:
    if isinstance(t, torch.Tensor):
        return None
    return TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")


def check_attention_inputs(
    fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float],
    fp8_kv: bool = False,
) -> None:
    """Checks q (B, Hq, Nq, D), k (B, Hkv, Nk, D) and v (B, Hkv, Nk, Dv), Dv (the output's head
    dim) independent of D (MLA: D = 192, Dv = 128); raises naming the bad argument. Nk = 0 is
    valid (every row sees no key: zeros, as torch's SDPA and flash-attn); a KV cache, which
    must hold keys, is checked for them in kvcache/checks.py.
    fp8_kv: k and v are an FP8 cache (kvcache/fp8_quant.py, which checks their dtypes)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        raise_error(tensor_error(fn, name, t))
        if t.dim() != 4:
            raise ValueError(f"{fn}: {name} must be 4-D (batch, heads, seq_len, head_dim), "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES and not (fp8_kv and name != "q"):
            raise TypeError(f"{fn}: {name} has dtype {t.dtype}; expected torch.float32, "
                            "torch.float16 or torch.bfloat16")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype and not fp8_kv:
            raise TypeError(f"{fn}: {name}.dtype ({t.dtype}) must equal q.dtype ({q.dtype})")
        if t.device != q.device:
            raise ValueError(f"{fn}: {name} is on {t.device} but q is on {q.device}; "
                             "all inputs must be on one device")
    if q.device.type not in SUPPORTED_DEVICE_TYPES:
        raise ValueError(f"{fn}: q is on {q.device}; expected a cpu or xpu tensor")
    (batch, heads_q, _, head_dim) = q.shape
    heads_kv = k.shape[1]
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] != batch:
            raise ValueError(f"{fn}: {name}.shape[0] (batch) is {t.shape[0]}, q's is {batch}")
    if k.shape[3] != head_dim:
        raise ValueError(f"{fn}: k.shape[3] (head_dim) is {k.shape[3]}, q's is {head_dim}")
    if v.shape[1:3] != k.shape[1:3]:
        raise ValueError(f"{fn}: v must have k's heads and seq_len, got v {tuple(v.shape)} and "
                         f"k {tuple(k.shape)}")
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(
            f"{fn}: q's head count ({heads_q}) must be a multiple of k's and v's ({heads_kv})")
    raise_error(head_dim_error(fn, head_dim, v.shape[3]))
    check_scale(fn, scale, "scale")


def head_dim_error(fn: str, head_dim: int, head_dim_v: int, q_name: str = "q.shape[3]",
                   v_name: str = "v.shape[3]") -> Optional[ValueError]:
    """The head dims the kernels take: q's and k's (`head_dim`) in [1, MAX_QK_HEAD_DIM], v's in
    [1, MAX_HEAD_DIM]; the error names the argument and its limit."""
    if not 1 <= head_dim <= MAX_QK_HEAD_DIM:
        return ValueError(f"{fn}: head_dim ({q_name}) must be in [1, {MAX_QK_HEAD_DIM}], got "
                          f"{head_dim} (q's and k's head dim; v's in [1, {MAX_HEAD_DIM}])")
    if not 1 <= head_dim_v <= MAX_HEAD_DIM:
        return ValueError(f"{fn}: v's head_dim ({v_name}) must be in [1, {MAX_HEAD_DIM}], got "
                          f"{head_dim_v} (q's and k's up to {MAX_QK_HEAD_DIM}: MLA's latent "
                          "and rope columns)")
    return None


INT32_MAX = 2**31 - 1  # the kernels' sizes, positions and windows are 32-bit


def check_max_seqlen(fn: str, name: str, value) -> None:
    """max_seqlen_q / max_seqlen_k of the varlen calls: the kernels take them as 32-bit."""
    if not isinstance(value, int) or not 0 <= value <= INT32_MAX:
        raise ValueError(f"{fn}: {name} must be an int in [0, 2^31 - 1], got {value!r}")


def softmax_scale(scale: Optional[float], head_dim: int, fn: str = "ipex_flash",
                  name: str = "softmax_scale") -> float:
    """The scale applied to q.k: 1/sqrt(head_dim) for None. A NaN or infinite scale would
    turn every output into NaN, so it is refused (a Python number: nothing is read from a
    device)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    check_scale(fn, scale, name)
    return float(scale)


def check_scale(fn: str, scale: Optional[float], name: str = "softmax_scale") -> None:
    raise_error(scale_error(fn, scale, name))


def scale_error(fn: str, scale: Optional[float],
                name: str = "softmax_scale") -> Optional[ValueError]:
    if scale is None or math.isfinite(float(scale)):
        return None
    return ValueError(f"{fn}: {name} must be a finite number or None, got {scale}")


def check_dropout_p(fn: str, dropout_p: float) -> None:
    raise_error(dropout_p_error(fn, dropout_p))


def dropout_p_error(fn: str, dropout_p: float) -> Optional[ValueError]:
    if isinstance(dropout_p, (int, float)) and 0.0 <= dropout_p < 1.0:
        return None
    return ValueError(f"{fn}: dropout_p must be in [0, 1), got {dropout_p}")


def check_dropout(fn: str, dropout_p: float, dropout_seed: Optional[torch.Tensor]) -> None:
    check_dropout_p(fn, dropout_p)
    if dropout_p > 0.0:
        if (not isinstance(dropout_seed, torch.Tensor) or dropout_seed.shape != (2,)
                or dropout_seed.dtype != torch.int64):
            raise ValueError(
                f"{fn}: dropout_p > 0 needs dropout_seed, an int64 tensor of shape (2,) "
                "(seed, offset)")


def check_backward_inputs(fn: str, grad_out: torch.Tensor, out: torch.Tensor,
                          lse: torch.Tensor, q: torch.Tensor, v: torch.Tensor) -> None:
    if not isinstance(grad_out, torch.Tensor):
        raise TypeError(f"{fn}: grad_out must be a torch.Tensor, got {type(grad_out).__name__}")
    shape = (*q.shape[:3], v.shape[3])  # the output's: q's rows, v's head dim
    for name, t in (("grad_out", grad_out), ("out", out)):
        if t.shape != shape:
            raise ValueError(
                f"{fn}: {name} must have the output's shape {shape}, got {tuple(t.shape)}")
    if grad_out.dtype != q.dtype or out.dtype != q.dtype:
        raise TypeError(
            f"{fn}: grad_out must have the output's dtype {q.dtype}, got {grad_out.dtype}")
    if grad_out.device != q.device:
        raise ValueError(f"{fn}: grad_out is on {grad_out.device} but q is on {q.device}")
    if lse.shape != q.shape[:3] or lse.dtype != torch.float32:
        raise ValueError(f"{fn}: lse must be float32 of shape {tuple(q.shape[:3])}")


def check_window(fn: str, window_size) -> tuple[int, int]:
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: window_size must be a pair of ints (left, right), got {window_size!r}")
    if left < -1 or right < -1:
        raise ValueError(f"{fn}: window_size values must be >= -1 (-1 = unbounded), got {window_size!r}")
    return window_bound(left), window_bound(right)


def window_bound(window: int) -> int:
    """A window side as the kernels take it (32-bit): one wider than any sequence can be
    hides nothing, so it is the unbounded -1."""
    return -1 if window > INT32_MAX else window


def check_softcap(fn: str, softcap: float) -> None:
    if not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"{fn}: softcap must be a finite number >= 0 (0 = off), got {softcap}")


def check_alibi(fn: str, alibi_slopes: Optional[torch.Tensor], batch: int, heads_q: int,
                device: torch.device) -> None:
    if alibi_slopes is None:
        return
    if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32:
        raise TypeError(f"{fn}: alibi_slopes must be a float32 tensor")
    if tuple(alibi_slopes.shape) not in ((heads_q,), (batch, heads_q)):
        raise ValueError(
            f"{fn}: alibi_slopes must have shape ({heads_q},) or ({batch}, {heads_q}), got "
            f"{tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != device:
        raise ValueError(f"{fn}: alibi_slopes is on {alibi_slopes.device}, q on {device}")


def check_cu_seqlens(fn: str, name: str, cu_seqlens: torch.Tensor, total: int,
                     device: torch.device, values: bool = True) -> int:
    """Checks a (B + 1,) int32 offsets tensor; returns B. values=False (fake tensors under
    torch.compile, whose contents are unknown) checks its dtype, shape and device only."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32:
        raise TypeError(f"{fn}: {name} must be an int32 tensor")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"{fn}: {name} must have shape (batch + 1,), got {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != device:
        raise ValueError(f"{fn}: {name} is on {cu_seqlens.device}, q on {device}")
    if values and cu_seqlens.device.type != "meta":
        summary = _checked_offsets.get(cu_seqlens)
        if summary is None:
            offsets = cu_seqlens.cpu()
            summary = (int(offsets[-1]), int((offsets[1:] - offsets[:-1]).max()))
            if offsets[0] != 0 or bool((offsets[1:] < offsets[:-1]).any()):
                summary = (total + 1, 0)  # refused below, and not kept
            else:
                _checked_offsets.put(cu_seqlens, summary)
        if summary[0] > total:
            raise ValueError(
                f"{fn}: {name} must start at 0, never decrease and end at most at the "
                f"packed length {total}, got {cu_seqlens.tolist()}")
    return cu_seqlens.shape[0] - 1


def longest_sequence(cu_seqlens: torch.Tensor) -> int:
    """The longest sequence of an offsets tensor check_cu_seqlens passed, from what it kept
    where it could."""
    summary = _checked_offsets.get(cu_seqlens)
    return summary[1] if summary is not None else int((cu_seqlens[1:] - cu_seqlens[:-1]).max())




def check_flash_inputs(fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       packed: bool) -> None:
    """q (B, Nq, Hq, D), k and v (B, Nk, Hkv, D); packed: (total, H, D). Reuses the SDPA
    checks on the (B, H, N, D) views."""
    rank = 3 if packed else 4
    layout = "(total_tokens, heads, head_dim)" if packed else "(batch, seq_len, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        raise_error(tensor_error(fn, name, t))
        if t.dim() != rank:
            raise ValueError(f"{fn}: {name} must be {rank}-D {layout}, got shape {tuple(t.shape)}")
    if packed:
        q, k, v = (t.unsqueeze(0) for t in (q, k, v))
    check_attention_inputs(fn, *(t.transpose(1, 2) for t in (q, k, v)), None)


MASK_DTYPES = (torch.bool, torch.float32, torch.float16, torch.bfloat16)


def mask_type_error(fn: str, attn_mask) -> Optional[TypeError]:
    if attn_mask is None or isinstance(attn_mask, torch.Tensor):
        return None
    return TypeError(f"{fn}: attn_mask must be a torch.Tensor or None, got "
                     f"{type(attn_mask).__name__}")


def check_attn_mask(fn: str, attn_mask: Optional[torch.Tensor], q: torch.Tensor,
                    k: torch.Tensor) -> None:
    """attn_mask as the kernels take it: a (B, Hq, Nq, Nk) view (broadcast dimensions with
    stride 0), bool (True = take part) or an additive float."""
    if attn_mask is None:
        return
    raise_error(mask_type_error(fn, attn_mask))
    if attn_mask.dtype not in MASK_DTYPES:
        raise TypeError(f"{fn}: attn_mask must be bool or float32/float16/bfloat16, got "
                        f"{attn_mask.dtype}")
    expected = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if tuple(attn_mask.shape) != expected:
        raise ValueError(f"{fn}: attn_mask must be viewed as (B, Hq, Nq, Nk) = {expected}, got "
                         f"{tuple(attn_mask.shape)}")
    if attn_mask.device != q.device:
        raise ValueError(f"{fn}: attn_mask is on {attn_mask.device} but q is on {q.device}")


def check_sinks(fn: str, sinks: Optional[torch.Tensor], q: torch.Tensor) -> None:
    """sinks: one logit per query head, (Hq,), float."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        raise TypeError(f"{fn}: sinks must be a float tensor of shape (heads_q,) or None")
    if tuple(sinks.shape) != (q.shape[1],):
        raise ValueError(f"{fn}: sinks must have shape ({q.shape[1]},) (one logit per query "
                         f"head), got {tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise ValueError(f"{fn}: sinks is on {sinks.device} but q is on {q.device}")
