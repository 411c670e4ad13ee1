"""SGLang on ipex_flash: a module shaped like sgl-kernel-xpu's sgl_kernel.flash_attn (the
attention entry points SGLang's XPU backend imports), with merge_state_v2 as sgl_kernel has it.

    from ipex_flash.integrations import sglang as ipex_sglang
    ipex_sglang.install()   # before SGLang imports its attention backend; see docs/serving.md

or IPEX_FLASH_SGLANG=1 in the environment of a process that imports ipex_flash (a
sitecustomize.py with `import ipex_flash` on the server's PYTHONPATH reaches SGLang's
scheduler processes too).

Layouts are sgl-kernel's: q packed (total_q, nheads, headdim) with cu_seqlens_q, the paged
cache (num_pages, page_size, nheads_k, headdim) with page_table (batch, pages) int32.
SGLang is not imported here.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types

import torch

import ipex_flash
from ipex_flash.kvcache import fp8_quant, qv_scores
from ipex_flash.integrations.sglang_states import merge_state_v2

Tensor = torch.Tensor
LOGGER = logging.getLogger("ipex_flash")
PACKAGE = "sgl_kernel"
MODULE = PACKAGE + ".flash_attn"
ENV_SWITCH = "IPEX_FLASH_SGLANG"
# SGLang's modules that bind sgl_kernel.flash_attn's functions when they are imported.
BINDING_MODULES = ("sglang.srt.layers.attention.xpu_backend",
                   "sglang.srt.layers.attention.flashattention_backend")
_FN = "ipex_flash.integrations.sglang.flash_attn_with_kvcache"
_VARLEN_FN = "ipex_flash.integrations.sglang.flash_attn_varlen_func"
_SWITCH_DTYPES = {"1": torch.bfloat16, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The output dtype of an FP8 q without out=: SGLang casts q to its FP8 cache's dtype and
# expects the model's dtype back (install(model_dtype=...)).
model_dtype = torch.bfloat16
__all__ = ["flash_attn_varlen_func", "flash_attn_with_kvcache", "install", "merge_state_v2"]


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=0, max_seqlen_k=0,
                            rotary_seqlens=None, q_descale=None, k_descale=None,
                            v_descale=None, softmax_scale=None, sinks=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                            return_softmax_lse=False, out=None):
    """sgl_kernel.flash_attn.flash_attn_with_kvcache's arguments, in its order, on
    ipex_flash.flash_attn_with_kvcache (its docstring has the masks, descales and appends).

    q (total_q, nheads, headdim) packed by cu_seqlens_q (batch + 1,) int32 with max_seqlen_q,
    or (batch, seqlen, nheads, headdim); the cache paged with page_table, or contiguous.
    qv (total_q, nheads, headdim_v): MLA's latent query, scored against v_cache (no copy when
    k_cache and v_cache are side by side columns of SGLang's one latent cache). Returns out
    (total_q, nheads, headdim_v), flattened for 4-D q as sgl-kernel returns it, and with
    return_softmax_lse (out, lse (nheads, total_q) float32, natural log).

    As in sgl-kernel-xpu: cu_seqlens_k_new without k and v is not read (SGLang's XPU backend
    has passed the cache's cumulative lengths there); max_seqlen_q 0 with cu_seqlens_q means
    "not given". An FP8 q (SGLang casts q to an FP8 cache's dtype) gives its output in the
    model's dtype: out's, else install(model_dtype=...) (bfloat16 unless told).
    """
    if k is None and v is None:
        cu_seqlens_k_new = None
    packed = isinstance(q, Tensor) and q.dim() == 3
    if packed and isinstance(cu_seqlens_q, Tensor) and not max_seqlen_q:
        max_seqlen_q = _longest(cu_seqlens_q)
    if not packed and isinstance(q, Tensor) and q.dim() == 4 and cu_seqlens_q is None:
        max_seqlen_q = None
    if not packed and isinstance(out, Tensor) and out.dim() == 3 and isinstance(q, Tensor):
        out = out.unflatten(0, q.shape[:2])  # (sgl-kernel's out is packed rows)
    if out is None and fp8_quant.is_fp8(q) and isinstance(v_cache, Tensor):
        out = torch.empty((*q.shape[:-1], v_cache.shape[-1]), dtype=model_dtype,
                          device=q.device)
    result = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad, page_table=page_table, softmax_scale=softmax_scale,
        causal=causal, window_size=window_size, softcap=softcap,
        rotary_interleaved=rotary_interleaved, num_splits=num_splits,
        return_softmax_lse=True, sinks=sinks, k_descale=k_descale, v_descale=v_descale,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, q_descale=q_descale, out=out,
        qv=qv, rotary_seqlens=rotary_seqlens, scheduler_metadata=scheduler_metadata,
        pack_gqa=pack_gqa, sm_margin=sm_margin)
    result, lse = result
    if not packed:  # (batch, seqlen, ...) as sgl-kernel returns it: packed rows
        result = result.flatten(0, 1)
        lse = lse.permute(1, 0, 2).flatten(1, 2)
    return (result, lse) if return_softmax_lse else result


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, sinks=None,
                           causal=False, qv=None, q_descale=None, k_descale=None,
                           v_descale=None, window_size=(-1, -1), softcap=0.0, num_splits=0,
                           pack_gqa=None, sm_margin=0, return_softmax_lse=False):
    """sgl_kernel.flash_attn.flash_attn_varlen_func's arguments, in its order, on
    ipex_flash.flash_attn_varlen_func: packed q (total_q, nheads, headdim), k
    (total_k, nheads_k, headdim), v (total_k, nheads_k, headdim_v), by cu_seqlens_q and
    cu_seqlens_k (batch + 1,) int32. SGLang's MLA prefill (192 / 128) and its chunked-prefix
    calls. qv (total_q, nheads, headdim_v) adds qv . v^T to the scores (k and v are
    concatenated for it: per-call tensors, not a cache). Returns out (total_q, nheads,
    headdim_v), or (out, lse (nheads, total_q)) with return_softmax_lse.

    seqused_q is refused unless None; seqused_k is taken with a paged cache only (this
    function has none, as sgl-kernel's passes none); pack_gqa and sm_margin are hints.
    """
    for name, value in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if value is not None:
            raise ValueError(f"{_VARLEN_FN}: {name} must be None (each sequence's lengths are "
                             "given by cu_seqlens_q and cu_seqlens_k)")
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise TypeError(f"{_VARLEN_FN}: pack_gqa must be None or a bool, got {pack_gqa!r}")
    if type(sm_margin) is not int or sm_margin < 0:
        raise ValueError(f"{_VARLEN_FN}: sm_margin must be an int >= 0, got {sm_margin!r}")
    if qv is not None:
        q, k = qv_scores.join_query_and_keys(_VARLEN_FN, q, qv, k, v, None, None, k_descale,
                                             v_descale)
    result = ipex_flash.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
        sinks=sinks, return_softmax_lse=return_softmax_lse, q_descale=q_descale,
        k_descale=k_descale, v_descale=v_descale, num_splits=num_splits)
    return result


def _longest(cu_seqlens_q: Tensor) -> int:
    """The longest sequence (a read on the host, where the caller gave no max_seqlen_q)."""
    if cu_seqlens_q.numel() < 2:
        return 0
    return int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())


def install(model_dtype=None) -> types.ModuleType:
    """Makes SGLang's XPU attention backend use this module; returns it.

    sys.modules["sgl_kernel.flash_attn"] becomes this module, so `from sgl_kernel.flash_attn
    import flash_attn_with_kvcache, flash_attn_varlen_func` gives ipex_flash's. An installed
    sgl_kernel (sgl-kernel-xpu, which SGLang's other XPU ops come from) is imported first and
    keeps everything else, merge_state_v2 and flash_mla_decode included; without one an empty
    package stands in, holding this module and merge_state_v2. Call it before SGLang imports
    its attention backend: a backend already imported with another flash_attn_with_kvcache
    raises RuntimeError, as does an installed sgl_kernel that fails to import.

    model_dtype: float16 or bfloat16, the output dtype of an FP8 q without out=.
    """
    module = sys.modules[__name__]
    if model_dtype is not None:
        if model_dtype not in fp8_quant.QUERY_DTYPES:
            raise ValueError(f"ipex_flash.integrations.sglang.install: model_dtype must be "
                             f"torch.float16 or torch.bfloat16, got {model_dtype!r}")
        module.model_dtype = model_dtype
    for name in BINDING_MODULES:
        bound = getattr(sys.modules.get(name), "flash_attn_with_kvcache", None)
        if bound is not None and bound is not flash_attn_with_kvcache:
            raise RuntimeError(f"ipex_flash.integrations.sglang.install: {name} was imported "
                               "before install() and keeps its own flash_attn_with_kvcache; "
                               "call install() first (e.g. from sitecustomize.py)")
    parent = sys.modules.get(PACKAGE)
    if parent is None and importlib.util.find_spec(PACKAGE) is not None:
        try:
            parent = importlib.import_module(PACKAGE)
        except Exception as error:  # a broken sgl-kernel must not be replaced silently
            raise RuntimeError(f"ipex_flash.integrations.sglang.install: the installed "
                               f"{PACKAGE} failed to import ({error!r}); SGLang needs its "
                               "other XPU ops, so fix or uninstall it") from error
    stand_in = parent is None
    if stand_in:
        parent = types.ModuleType(PACKAGE, "Stands in for sgl_kernel (not installed): "
                                  "ipex_flash.integrations.sglang.install()")
        parent.__path__ = []
        parent.merge_state_v2 = merge_state_v2
        sys.modules[PACKAGE] = parent
    sys.modules[MODULE] = module
    parent.flash_attn = module
    LOGGER.info("sgl_kernel.flash_attn is ipex_flash.integrations.sglang "
                "(flash_attn_with_kvcache, flash_attn_varlen_func on ipex_flash's kernels; "
                "%s; FP8 queries give %s)",
                "sgl_kernel is a stand-in package" if stand_in
                else f"sgl_kernel from {getattr(parent, '__file__', '?')} keeps its other ops",
                str(module.model_dtype).replace("torch.", ""))
    return module


def install_from_env() -> bool:
    """install() if IPEX_FLASH_SGLANG asks for it: "1" or "bfloat16" (FP8 queries give
    bfloat16), "float16"; "0" or empty: not. Any other value raises ValueError."""
    value = os.environ.get(ENV_SWITCH, "").strip().lower()
    if value in ("", "0"):
        return False
    if value not in _SWITCH_DTYPES:
        raise ValueError(f"{ENV_SWITCH}={value!r}: expected 1, bfloat16 or float16 (install "
                         "ipex_flash as sgl_kernel.flash_attn; the dtype FP8 queries give), "
                         "or 0")
    install(model_dtype=_SWITCH_DTYPES[value])
    return True
