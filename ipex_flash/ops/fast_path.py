"""The eager fast path of the forwards: calls that need nothing the dispatcher gives (autograd,
tracing, modes, transforms) skip it, and a call whose signature was seen before runs its launch
plan (launch_plans.py) in one crossing, on CPU tensors and XPU streams alike. The op's way
through torch.library (autograd wrapper, dispatcher, Python redispatch) and the checks of every
argument cost more host time than a small call's kernels (measured on the CPU device:
scripts/bench/benchmark_host_cost.py)."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch._C._functorch import peek_interpreter_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ipex_flash.ops import (
    attention_forward as attention_ops, flash_attn_args, launch, launch_plans, varlen_decode)
from ipex_flash.ops.launch_plans import tensor_signature as signature
from ipex_flash.ops.validation import check_window, softmax_scale as softmax_scale_value

Tensor = torch.Tensor


def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Optional[float],
            dropout_p: float, dropout_seed: Optional[Tensor], deterministic: bool,
            attn_mask: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
            softcap: float = 0.0, plans: bool = True) -> tuple[Tensor, Tensor]:
    """torch.ops.ipex_flash.attention_forward, or its implementation called directly when
    nothing needs the dispatcher: plain tensors, no gradient wanted, no tracing, mode or
    transform. plans=False: the caller keeps its own plans of such calls (sdpa)."""
    args = (q, k, v, causal, scale, dropout_p, dropout_seed, deterministic, attn_mask, sinks,
            softcap)
    if needs_dispatcher(q, k, v, attn_mask, sinks):
        return torch.ops.ipex_flash.attention_forward(*args)
    if attn_mask is not None or dropout_p != 0.0 or not plans:
        return attention_ops.attention_forward_impl(*args)
    key = ("attention", causal, scale, softcap, signature(q), signature(k), signature(v),
           signature(sinks))
    plan = launch_plans.cached(key)
    if plan:
        out, lse = attention_ops.forward_outputs(q, v)
        if launch_plans.run(plan, q, k, v, out, lse, sinks=sinks):
            return out, lse
    out, lse = attention_ops.attention_forward_impl(*args)
    if plan is None:
        launch_plans.remember(key, lambda: _sdpa_plan(q, k, v, None, causal, scale, sinks,
                                                      softcap))
    return out, lse


def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
         is_causal: bool, scale: Optional[float], enable_gqa: bool, softcap: float,
         sinks: Optional[Tensor], general: Callable[[], Tensor]) -> Tensor:
    """The SDPA drop-in's output for 4-D tensors without dropout, by the plan of this
    signature, else by general() (which checks and runs the call)."""
    plan_key = ("sdpa", is_causal, scale, enable_gqa, softcap, signature(query),
                signature(key), signature(value), signature(attn_mask), signature(sinks))
    plan = launch_plans.cached(plan_key)
    if plan:
        out = launch.output_like(query, value.shape[-1])
        if launch_plans.run(plan, query, key, value, out, None, sinks=sinks,
                            attn_mask=attn_mask):
            return out
    out = general()
    if plan is None:
        launch_plans.remember(plan_key, lambda: _sdpa_plan(query, key, value, attn_mask,
                                                           is_causal, scale, sinks, softcap))
    return out


def flash_forward(q: Tensor, k: Tensor, v: Tensor, softmax_scale: Optional[float],
                  causal: bool, window: tuple, softcap: float, alibi_slopes: Optional[Tensor],
                  sinks: Optional[Tensor], want_lse: bool,
                  general: Callable[[], tuple[Tensor, Tensor]],
                  packed: Optional[tuple] = None) -> tuple[Tensor, Optional[Tensor]]:
    """flash_attn_func's forward without dropout, q (B, Nq, Hq, D), or flash_attn_varlen_func's
    with packed = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), q (total_q, Hq, D):
    (out, lse in the kernels' exp2 domain, or None unless want_lse) by the plan of this
    signature, else by general(), the op, which checks. A packed call's offsets are checked on
    every call (LaunchPlan.run; packed_values off the CPU device)."""
    cu_seqlens, lengths = (None, None), ()
    if packed is not None:
        cu_seqlens, lengths = packed[:2], packed[2:]
    key = ("flash", softmax_scale, causal, window, softcap, lengths, signature(q), signature(k),
           signature(v), signature(alibi_slopes), signature(sinks), signature(cu_seqlens[0]),
           signature(cu_seqlens[1]))
    plan = launch_plans.cached(key)
    fits, max_len_k = True, -1  # (C++ reads packed offsets itself on the CPU device)
    if plan and packed is not None and not launch_plans.reads_host_memory(q.device):
        max_len_k = launch_plans.packed_values(*cu_seqlens, q, k, *lengths, plan.packed_queries)
        fits = max_len_k >= 0
    if plan and fits:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if packed is None \
            else (q.shape[1], q.shape[0])
        out, lse = launch.attention_outputs(q, v.shape[-1], lse_shape, want_lse)
        if launch_plans.run(plan, q, k, v, out, lse, alibi_slopes, sinks, cu_seqlens=cu_seqlens,
                            max_len_k=max_len_k):
            return out, lse
    out, lse = general()
    if plan is None:
        launch_plans.remember(key, lambda: _flash_plan(q, k, v, softmax_scale, causal, window,
                                                       softcap, alibi_slopes, sinks, packed))
    return out, lse


def _flash_plan(q, k, v, softmax_scale, causal, window, softcap, alibi_slopes, sinks, packed):
    cu_q, cu_k, max_q, max_k = (None, None, 0, 0) if packed is None else packed
    q_, k_, v_ = (flash_attn_args.bhnd(t, packed is not None) for t in (q, k, v))
    if (not (plain_layout(q, k, v) and plain_sinks(sinks)) or launch.nothing_to_attend(q_, k_)
            or not (alibi_slopes is None or (alibi_slopes.dtype == torch.float32
                                             and alibi_slopes.is_contiguous()))
            or not all(t is None or t.is_contiguous() for t in (cu_q, cu_k))):
        return None
    out, lse = flash_attn_args.forward_outputs(q, v, packed is not None)

    def options(cu_q, cu_k):
        return flash_attn_args.flash_options(
            cu_q, cu_k, max_q, max_k, softmax_scale_value(softmax_scale, q.shape[-1]), causal,
            *check_window("ipex_flash.flash_attn_func", window), float(softcap), alibi_slopes,
            0.0, None, sinks)

    if packed is not None:  # a decode step: the decode kernel, its keys read as a cache
        views = varlen_decode.decode_views(q, k, v, out, lse, cu_q, max_q)
        if views is not None:
            as_cache = options(None, None)
            varlen_decode.as_cache(as_cache, cu_k, max_k)
            plan = launch_plans.new_plan(*views, as_cache, min_keys=max_q)
            plan.packed_sequences(max_k)
            return plan
    return launch_plans.new_plan(q_, k_, v_, flash_attn_args.bhnd(out, packed is not None), lse,
                                 options(cu_q, cu_k))


def _sdpa_plan(q, k, v, attn_mask, causal, scale, sinks, softcap):
    """The plan of a checked 4-D SDPA call without dropout, or None where the general path
    adapts the inputs (copies, conversions) or launches nothing. The mask is read in place
    through its (B, Hq, Nq, Nk) broadcast view, as the general path reads it."""
    if not (plain_layout(q, k, v) and plain_sinks(sinks)) or launch.nothing_to_attend(q, k):
        return None
    mask = None if attn_mask is None else attn_mask.expand(*q.shape[:3], k.shape[2])
    out, lse = attention_ops.forward_outputs(q, v)
    options = attention_ops.sdpa_options(q, causal, scale, 0.0, None, mask, sinks, softcap)
    return launch_plans.new_plan(q, k, v, out, lse, options)


def plain_layout(*tensors: Tensor) -> bool:
    """The kernels read these as they are (no copy for a strided last dimension)."""
    return all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in tensors)


def plain_sinks(sinks: Optional[Tensor]) -> bool:
    """Sinks the kernels read as they are (launch.float_sinks converts others)."""
    return sinks is None or (sinks.dtype == torch.float32 and sinks.is_contiguous())


def needs_dispatcher(*tensors: Optional[Tensor]) -> bool:
    # A functorch transform (vmap, grad) hands the call wrapped tensors: one look at its
    # interpreter stack costs less than asking each tensor.
    if (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
            or peek_interpreter_stack() is not None):
        return True
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or (grad and t.requires_grad)):
            return True
    return False
