"""ring-flash-attention's packed forms: qkv (batch, seqlen_local, 3, nheads, headdim) and kv
(batch, seqlen_local, 2, nheads_k, headdim), or (total_local, 3 or 2, heads, headdim) for
varlen. Views of the packed tensor; gradients flow back into it. Arguments otherwise as
the function each wraps (ring, zigzag, stripe; ring and zigzag varlen)."""
from __future__ import annotations

from ipex_flash.distributed.ring import ring_flash_attn_func, zigzag_ring_flash_attn_func
from ipex_flash.distributed.stripe import stripe_flash_attn_func
from ipex_flash.distributed.varlen import ring_flash_attn_varlen_func
from ipex_flash.distributed.zigzag_varlen import zigzag_ring_flash_attn_varlen_func


def _unpack(fn, tensor, count, dim, name):
    if getattr(tensor, "dim", lambda: -1)() < dim + 2 or tensor.shape[dim] != count:
        raise ValueError(f"ipex_flash.distributed.{fn}: {name} must have size {count} at "
                         f"dimension {dim}, got shape {tuple(getattr(tensor, 'shape', ()))}")
    return tensor.unbind(dim)


def ring_flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
        window_size=(-1, -1), alibi_slopes=None, deterministic=False, return_attn_probs=False,
        group=None, *, softcap=0.0, sinks=None):
    q, k, v = _unpack("ring_flash_attn_qkvpacked_func", qkv, 3, 2, "qkv")
    return ring_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
        alibi_slopes, deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)


def ring_flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
        window_size=(-1, -1), alibi_slopes=None, deterministic=False, return_attn_probs=False,
        group=None, *, softcap=0.0, sinks=None):
    k, v = _unpack("ring_flash_attn_kvpacked_func", kv, 2, 2, "kv")
    return ring_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
        alibi_slopes, deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)


def zigzag_ring_flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
        window_size=(-1, -1), alibi_slopes=None, deterministic=False, return_attn_probs=False,
        group=None, *, softcap=0.0, sinks=None):
    q, k, v = _unpack("zigzag_ring_flash_attn_qkvpacked_func", qkv, 3, 2, "qkv")
    return zigzag_ring_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
        alibi_slopes, deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)


def zigzag_ring_flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
        window_size=(-1, -1), alibi_slopes=None, deterministic=False, return_attn_probs=False,
        group=None, *, softcap=0.0, sinks=None):
    k, v = _unpack("zigzag_ring_flash_attn_kvpacked_func", kv, 2, 2, "kv")
    return zigzag_ring_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
        alibi_slopes, deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)


def ring_flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
        softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None,
        deterministic=False, return_attn_probs=False, group=None, *, softcap=0.0, sinks=None):
    q, k, v = _unpack("ring_flash_attn_varlen_qkvpacked_func", qkv, 3, 1, "qkv")
    return ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p,
        softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs,
        group, softcap=softcap, sinks=sinks)


def ring_flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens, max_seqlen, dropout_p=0.0,
        softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None,
        deterministic=False, return_attn_probs=False, group=None, *, softcap=0.0, sinks=None):
    k, v = _unpack("ring_flash_attn_varlen_kvpacked_func", kv, 2, 1, "kv")
    return ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p,
        softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs,
        group, softcap=softcap, sinks=sinks)


def stripe_flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
        window_size=(-1, -1), alibi_slopes=None, deterministic=False, return_attn_probs=False,
        group=None, *, softcap=0.0, sinks=None):
    q, k, v = _unpack("stripe_flash_attn_qkvpacked_func", qkv, 3, 2, "qkv")
    return stripe_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
        alibi_slopes, deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)


def stripe_flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
        window_size=(-1, -1), alibi_slopes=None, deterministic=False, return_attn_probs=False,
        group=None, *, softcap=0.0, sinks=None):
    k, v = _unpack("stripe_flash_attn_kvpacked_func", kv, 2, 2, "kv")
    return stripe_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
        alibi_slopes, deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)


def zigzag_ring_flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
        softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None,
        deterministic=False, return_attn_probs=False, group=None, *, softcap=0.0, sinks=None):
    q, k, v = _unpack("zigzag_ring_flash_attn_varlen_qkvpacked_func", qkv, 3, 1, "qkv")
    return zigzag_ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p,
        softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs,
        group, softcap=softcap, sinks=sinks)


def zigzag_ring_flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens, max_seqlen, dropout_p=0.0,
        softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None,
        deterministic=False, return_attn_probs=False, group=None, *, softcap=0.0, sinks=None):
    k, v = _unpack("zigzag_ring_flash_attn_varlen_kvpacked_func", kv, 2, 1, "kv")
    return zigzag_ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p,
        softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs,
        group, softcap=softcap, sinks=sinks)
