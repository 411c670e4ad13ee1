"""The eager fast path of the forward: calls that need nothing the dispatcher gives (autograd,
tracing, modes, transforms) skip it, and small CPU calls are prepared in C++ in one crossing.
The op's way through torch.library (autograd wrapper, dispatcher, Python redispatch) cost more
host time than a small call's kernels (measured on the CPU device)."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch._C._functorch import is_functorch_wrapped_tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ipex_flash import _runtime
from ipex_flash._runtime import C
from ipex_flash.ops import attention as attention_ops, launch
from ipex_flash.ops.validation import softmax_scale

Tensor = torch.Tensor


def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Optional[float],
            dropout_p: float, dropout_seed: Optional[Tensor], deterministic: bool,
            attn_mask: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
            softcap: float = 0.0) -> tuple[Tensor, Tensor]:
    """torch.ops.ipex_flash.attention_forward, or its implementation called directly when
    nothing needs the dispatcher: plain tensors, no gradient wanted, no tracing, mode or
    transform."""
    args = (q, k, v, causal, scale, dropout_p, dropout_seed, deterministic, attn_mask, sinks,
            softcap)
    if _needs_dispatcher(q, k, v, attn_mask, sinks):
        return torch.ops.ipex_flash.attention_forward(*args)
    if attn_mask is None and sinks is None and not softcap and dropout_p == 0.0:
        result = _small_call(q, k, v, causal, scale)
        if result is not None:
            return result
    return attention_ops.attention_forward_impl(*args)


def _small_call(q: Tensor, k: Tensor, v: Tensor, causal: bool,
                scale: Optional[float]) -> Optional[tuple[Tensor, Tensor]]:
    """out, lse from C.small_call_cpu, or None when the call is not one it serves (then the
    general path checks the inputs and runs it)."""
    if not (q.is_cpu and k.is_cpu and v.is_cpu and q.dim() == 4 and k.dim() == 4
            and k.shape == v.shape and q.dtype == k.dtype == v.dtype
            and q.dtype in _SMALL_CALL_DTYPES
            and (scale is None or math.isfinite(scale))):
        return None
    if _runtime.OPENMP_SPIN == "late":
        launch.warn_openmp_spin()
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32)
    if C.small_call_cpu(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                        launch.DTYPE_NAMES[q.dtype], q.shape, q.stride(), k.shape, k.stride(),
                        v.stride(), out.stride(), softmax_scale(scale, q.shape[-1]), causal):
        return out, lse
    return None


_SMALL_CALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _needs_dispatcher(*tensors: Optional[Tensor]) -> bool:
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return True
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or (grad and t.requires_grad)
                              or is_functorch_wrapped_tensor(t)):
            return True
    return False
