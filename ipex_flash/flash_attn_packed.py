"""flash-attn's packed functions: q, k and v (or k and v) stacked in one tensor, as models with
a fused QKV projection produce them. Each is a view of its slices handed to flash_attn_func or
flash_attn_varlen_func (no copy: the kernels take strided rows), so every option, the
return values and the gradient (which flows back into the packed tensor) are theirs."""
from __future__ import annotations

from ipex_flash.flash_attn_interface import flash_attn_func, flash_attn_varlen_func


def _unstack(fn: str, name: str, t, parts: int, dims: int, layout: str):
    """The `parts` slices along dim -3 of a packed tensor, after checking its shape."""
    shape = tuple(getattr(t, "shape", ()))
    if getattr(t, "dim", None) is None or t.dim() != dims or shape[-3] != parts:
        raise ValueError(f"{fn}: {name} must have shape {layout}, got {shape}")
    return t.unbind(dim=-3)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """flash_attn_func with qkv of shape (batch, seqlen, 3, nheads, headdim)."""
    q, k, v = _unstack("ipex_flash.flash_attn_qkvpacked_func", "qkv", qkv, 3, 5,
                       "(batch, seqlen, 3, nheads, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """flash_attn_func with kv of shape (batch, seqlen_k, 2, nheads_k, headdim)."""
    k, v = _unstack("ipex_flash.flash_attn_kvpacked_func", "kv", kv, 2, 5,
                    "(batch, seqlen_k, 2, nheads_k, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func with qkv of shape (total, 3, nheads, headdim), the same
    cu_seqlens and max_seqlen for queries and keys."""
    q, k, v = _unstack("ipex_flash.flash_attn_varlen_qkvpacked_func", "qkv", qkv, 3, 4,
                       "(total, 3, nheads, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """flash_attn_varlen_func with kv of shape (total_k, 2, nheads_k, headdim)."""
    k, v = _unstack("ipex_flash.flash_attn_varlen_kvpacked_func", "kv", kv, 2, 4,
                    "(total_k, 2, nheads_k, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)
