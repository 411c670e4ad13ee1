"""flash-attn's flash_attn_with_kvcache on the ipex_flash kernels: attention of a few new
query tokens against a KV cache, contiguous or paged, appending the new keys and values in
place. Layout (batch, seq_len, heads, head_dim). The ops behind it are in kvcache/cache_ops.py.
"""
from __future__ import annotations

from typing import Union

import torch

from ipex_flash.flash_attn_interface import flash_attn_varlen_func
from ipex_flash.kvcache import engine_args, fast_calls, fp8_quant, kvcache_engine, qv_scores
from ipex_flash.kvcache.checks import (
    cache_capacity, check_batch_idx, check_block_table_entries, check_cache, check_fits,
    check_page_size, check_seqlens)
from ipex_flash.kvcache.leftpad import check_leftpad, check_leftpad_combination
from ipex_flash.kvcache.rotary import check_rotary, rotate_new_tokens
from ipex_flash.ops.fast_path import needs_dispatcher
from ipex_flash.ops.validation import check_alibi, check_scale, check_softcap, check_window

Tensor = torch.Tensor
_FN = "ipex_flash.flash_attn_with_kvcache"


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens: Union[int, Tensor, None] = None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, sinks=None, k_descale=None,
                            v_descale=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, max_seqlen_k=None,
                            q_descale=None, out=None, qv=None, rotary_seqlens=None,
                            attention_chunk=0, scheduler_metadata=None, pack_gqa=None,
                            sm_margin=0):
    """Attention of new query tokens against a KV cache, with flash-attn's semantics and
    positional order (flash_attn_interface v2.8).

    Args:
        q: (batch, seqlen_q, nheads, headdim): the new tokens' queries.
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim), or with block_table
            a paged cache (num_blocks, page_size, nheads_k, headdim); v_cache's head dim
            (headdim_v, that of the output) may differ from headdim. page_size a multiple of
            16 up to 512. Modified in place when k and v are given: then they must have
            memory of their own (not expanded) and must not require grad.
        k, v: optional (batch, seqlen_new, nheads_k, headdim or headdim_v): appended to the cache at
            positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before attending.
        rotary_cos, rotary_sin: optional (seqlen_ro, rotary_dim / 2): rotary embedding of the
            first rotary_dim features of the new k (token i at position cache_seqlens + i)
            and of q (likewise when causal or local, else all at cache_seqlens); needs k, v.
        cache_seqlens: int or (batch,) int32: keys already in each sequence's cache (default:
            the whole cache).
        cache_batch_idx: optional (batch,) int32: the cache row of each sequence (default
            0 .. batch - 1); not with block_table.
        cache_leftpad: optional (batch,) int32: the cache row where each sequence's keys
            start (default 0): keys are rows cache_leftpad[b] .. cache_seqlens[b] (+ new);
            masks and ALiBi count from there. Not with block_table.
        block_table: optional (batch, max_blocks_per_seq) int32: the pages of each sequence.
        softmax_scale, causal, window_size, softcap, alibi_slopes: as flash_attn_func; masks
            are aligned to the bottom-right, i.e. new token i sits at position
            cache_seqlens[b] + i.
        rotary_interleaved: rotate features (2i, 2i + 1) together (GPT-J) rather than i and
            i + rotary_dim / 2 (GPT-NeoX).
        num_splits: splits of each sequence's keys in the decode kernel; 0 chooses. A hint,
            as in flash-attn: clamped to one split per 16 keys (the decode kernel's smallest
            key block; more splits would be empty), and unused by the general kernel.
        return_softmax_lse: also return the (batch, nheads, seqlen_q) float32 log-sum-exp.
        sinks: optional (nheads,) attention-sink logits, as in flash_attn_func.
        k_descale, v_descale: with a float8_e4m3fn or float8_e5m2 cache (q float16 or
            bfloat16), the factors its elements are multiplied by (flash-attn 3's names): one
            value, or (batch, nheads_k); default 1. New k, v in q's dtype are divided by them
            and rounded to the cache's dtype, saturating; the kernels dequantise in registers.

    flash-attn 3's and sgl-kernel's keywords (their order after v differs from flash-attn 2's,
    kept above; SGLang passes them by name):
        page_table: a second name for block_table.
        cu_seqlens_q, max_seqlen_q: q packed as (total_q, nheads, headdim), sequence b rows
            cu_seqlens_q[b]:cu_seqlens_q[b+1]; runs flash_attn_varlen_func over the cache
            (a contiguous cache is read as pages of its rows: seqlen_cache a multiple of 16).
            Returns out (total_q, nheads, headdim_v) and lse (nheads, total_q).
        cu_seqlens_k_new: k, v packed as (total_new, nheads_k, headdim), appended per sequence.
        q_descale, k_descale, v_descale: as in flash_attn_varlen_func (an FP8 q with an FP8
            cache; with a 16-bit q, q_descale must be 1); with a 16-bit cache, applied by
            scaling. Appended 16-bit k, v are stored divided by their descales, FP8 or 16-bit
            cache alike; k, v in the FP8 cache's dtype as given.
        out: the output, written in place and returned (shape of the result; q's dtype, or
            with an FP8 q float16 or bfloat16, the dtype of the output the caller wants).
        qv: (..., nheads, headdim_v), q's shape with v's head dim: a second query scored
            against the values (MLA's extend: q the rope part, qv the latent part): scores
            q . k^T + qv . v^T, times softmax_scale (default 1 / sqrt(headdim + headdim_v)).
            Run as one product of [q, qv] with [k_cache, v_cache] (headdim + headdim_v <=
            576): a view without a copy where the two caches are side by side columns of one
            tensor (SGLang's latent cache), else a concatenated copy of both caches on every
            call. Not with k, v; k_descale and v_descale equal or None (kvcache/qv_scores.py).
        max_seqlen_k, scheduler_metadata, pack_gqa, sm_margin: hints, unused. rotary_seqlens
            and attention_chunk: refused unless None / 0.

    Few new tokens per sequence (nheads / nheads_k * seqlen_q <= 16) run the split-KV decode
    kernel; more run the general kernel over the cache.
    """
    if page_table is not None:
        if block_table is not None:
            raise ValueError(f"{_FN}: give the pages as block_table or as page_table, not both")
        block_table = page_table
    window_size = engine_args.as_window(window_size)
    softcap = 0.0 if softcap is None else softcap
    if (cu_seqlens_q is not None or q_descale is not None or out is not None
            or cu_seqlens_k_new is not None or qv is not None or rotary_seqlens is not None
            or attention_chunk or scheduler_metadata is not None or pack_gqa is not None
            or sm_margin or (isinstance(q, Tensor) and q.dim() == 3)
            or ((k_descale is not None or v_descale is not None)
                and not fp8_quant.is_fp8(k_cache))):
        return _engine_call(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                            cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                            window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
                            return_softmax_lse, sinks, k_descale, v_descale, cu_seqlens_q,
                            cu_seqlens_k_new, max_seqlen_q, q_descale, out, qv, rotary_seqlens,
                            attention_chunk, scheduler_metadata, pack_gqa, sm_margin)
    if (isinstance(cache_seqlens, Tensor) and type(window_size) is tuple
            and type(num_splits) is int
            and (cache_batch_idx is None or (block_table is None
                                             and type(cache_batch_idx) is Tensor))
            and not needs_dispatcher(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                     cache_batch_idx, cache_leftpad, alibi_slopes, sinks,
                                     k_descale, v_descale, rotary_cos, rotary_sin)
            and not (k_cache.requires_grad or v_cache.requires_grad)):
        # A decode step: its launch plan (append included), once a first call of the same
        # signature has been checked and run by the general path.
        out, lse = fast_calls.kvcache_decode(
            q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_leftpad, softmax_scale,
            causal, window_size, softcap, alibi_slopes, sinks, num_splits, k_descale,
            v_descale, (rotary_cos, rotary_sin, rotary_interleaved), return_softmax_lse,
            cache_batch_idx=cache_batch_idx,
            general=lambda: _general(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                     cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                     softmax_scale, causal, window_size, softcap,
                                     rotary_interleaved, alibi_slopes, num_splits, sinks,
                                     k_descale, v_descale))
        return (out, lse) if return_softmax_lse else out
    out, lse = _general(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                        cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                        window_size, softcap, rotary_interleaved, alibi_slopes, num_splits, sinks,
                        k_descale, v_descale)
    return (out, lse) if return_softmax_lse else out


def _general(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
             cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
             rotary_interleaved, alibi_slopes, num_splits, sinks, k_descale, v_descale):
    """Checks every argument, appends, and attends through the ops (kvcache/cache_ops.py):
    (out, lse)."""
    fp8 = check_cache(q, k_cache, v_cache, block_table)
    k_descale, v_descale = fp8_quant.descales(_FN, k_descale, v_descale, fp8, q.shape[0],
                                             k_cache.shape[2], q.device)
    left, right = check_window(_FN, window_size)
    check_softcap(_FN, softcap)
    check_scale(_FN, softmax_scale)  # before the append: a refused call leaves the cache as it was
    check_alibi(_FN, alibi_slopes, q.shape[0], q.shape[2], q.device)
    check_leftpad_combination(_FN, cache_leftpad, block_table)
    if not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"{_FN}: num_splits must be an int >= 0 (0 chooses), got {num_splits!r}")
    if block_table is not None:
        check_page_size(k_cache)
    check_batch_idx(cache_batch_idx, q.shape[0], k_cache, block_table)
    rotary_dim = check_rotary(_FN, rotary_cos, rotary_sin, q.shape[3], k is not None)
    if cache_batch_idx is not None:
        # Each sequence's cache row is one page of seqlen_cache keys: the paged path reads it.
        block_table = cache_batch_idx.view(-1, 1)
    capacity = cache_capacity(k_cache, block_table)
    if cache_seqlens is None:
        cache_seqlens = capacity if k is None else 0
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    check_seqlens(cache_seqlens, q.shape[0], q.device, "cache_seqlens")
    check_leftpad(_FN, cache_leftpad, q.shape[0], q.device, cache_seqlens)
    seqlens_k = cache_seqlens
    if (k is None) != (v is None):
        raise ValueError(f"{_FN}: k and v must be given together")
    if k is not None:
        for name, t, cache in (("k", k, k_cache), ("v", v, v_cache)):
            expected = (q.shape[0], k.shape[1] if k.dim() == 4 else -1, cache.shape[2],
                        cache.shape[3])
            if not isinstance(t, torch.Tensor) or t.dim() != 4 or tuple(t.shape) != expected:
                raise ValueError(f"{_FN}: {name} must have shape (batch, seqlen_new, nheads_k, "
                                 f"headdim) = {expected}, got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else t}")
            if t.dtype != k_cache.dtype and not (fp8 and t.dtype == q.dtype):
                raise TypeError(f"{_FN}: {name}.dtype ({t.dtype}) must equal the cache's "
                                f"({k_cache.dtype})" + (f" or q's ({q.dtype})" if fp8 else ""))
        check_fits(cache_seqlens, k.shape[1], capacity)
        if cache_batch_idx is None and block_table is not None:  # (before the append)
            check_block_table_entries(_FN, block_table, k_cache.shape[0],
                                      cache_seqlens + k.shape[1], k_cache.shape[1])
        if rotary_dim:
            q, k = rotate_new_tokens(_FN, q, k, rotary_cos, rotary_sin, cache_seqlens,
                                      rotary_interleaved, causal, window_size)
        torch.ops.ipex_flash.kvcache_append(k_cache, v_cache, k, v, cache_seqlens, block_table,
                                            k_descale, v_descale)
        seqlens_k = cache_seqlens + k.shape[1]
    else:
        check_fits(cache_seqlens, 0, capacity)
    out, lse = torch.ops.ipex_flash.kvcache_attention(
        q, k_cache, v_cache, seqlens_k, block_table, softmax_scale, causal, left, right,
        float(softcap), alibi_slopes, sinks, num_splits, k_descale, v_descale, cache_leftpad)
    return out, lse


def _engine_call(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                 cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_size,
                 softcap, rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse, sinks,
                 k_descale, v_descale, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, q_descale,
                 out, qv, rotary_seqlens, attention_chunk, scheduler_metadata, pack_gqa,
                 sm_margin):
    """flash-attn 3's form of the call (kvcache/kvcache_engine.py)."""
    kvcache_engine.check_fa3_extras(rotary_seqlens, attention_chunk)
    engine_args.check_hints(_FN, scheduler_metadata, 2, num_splits, pack_gqa, sm_margin,
                            metadata_is_hint=True)
    if not isinstance(q, Tensor) or q.dim() not in (3, 4):
        raise ValueError(f"{_FN}: q must be (batch, seqlen, nheads, headdim), or packed "
                         "(total_q, nheads, headdim) with cu_seqlens_q")
    if qv is not None:  # (scores q . k^T + qv . v^T: one product of joined tensors)
        q, k_cache = qv_scores.join_query_and_keys(_FN, q, qv, k_cache, v_cache, k, v,
                                                   k_descale, v_descale)
    if q.dim() == 3:
        return kvcache_engine.packed_call(
            q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
            block_table, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_cos, out,
            flash_attn_varlen_func, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
            return_softmax_lse=return_softmax_lse, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale, num_splits=num_splits)
    if cu_seqlens_q is not None or cu_seqlens_k_new is not None:
        raise ValueError(f"{_FN}: cu_seqlens_q and cu_seqlens_k_new are taken with packed q "
                         "(total_q, nheads, headdim)")
    if not isinstance(k_cache, Tensor) or k_cache.dim() != 4:
        check_cache(q, k_cache, v_cache, block_table)  # (raises naming it)
    descaled = engine_args.apply_descales(_FN, q, k_cache.dtype, q_descale, k_descale, v_descale,
                                          q.shape[0], k_cache.shape[2],
                                          out_dtype=getattr(out, "dtype", None))
    if out is not None:
        engine_args.check_out(_FN, out, (*q.shape[:3], v_cache.shape[3]), descaled.q.dtype,
                              q.device)
    if k is not None and v is not None:  # (with the descales as given, not as folded)
        k, v = kvcache_engine.stored_as(k, v, k_cache, k_descale, v_descale, q.shape[0])
    result, lse = _general(descaled.q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                           cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                           softmax_scale, causal, window_size, softcap, rotary_interleaved,
                           alibi_slopes, num_splits, sinks, descaled.k_descale,
                           descaled.v_descale)
    if out is not None:
        result = out.copy_(result)
    result = descaled.scaled(result, in_place=True)
    return (result, lse) if return_softmax_lse else result
