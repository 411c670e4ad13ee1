"""flash-attn's API (Dao-AILab/flash-attention) on the ipex_flash kernels, so users of
flash-attn switch by changing an import. Layout (batch, seq_len, heads, head_dim), or
(total_tokens, heads, head_dim) for the varlen functions. The ops behind it are in
ops/flash_attn.py; flash_attn_with_kvcache is in flash_attn_kvcache.py, the packed functions
in flash_attn_packed.py.
"""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash.kvcache import engine_args, fp8_quant
from ipex_flash.kvcache.paged_varlen import paged_varlen_func
from ipex_flash.kvcache.varlen_engine import engine_call as _engine_call
from ipex_flash.ops import flash_attn as _flash_attn_ops  # noqa: F401  (registers the ops)
from ipex_flash.ops import fast_path, launch
from ipex_flash.ops.attn_probs import attn_probs
from ipex_flash.ops.validation import (
    check_dropout_p, check_max_seqlen, check_scale, check_window)

Tensor = torch.Tensor


def _seed(q: Tensor, dropout_p: float) -> Optional[Tensor]:
    return launch.draw_dropout_seed(q.device) if dropout_p > 0.0 else None


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, sinks=None):
    """Attention with flash-attn's semantics and layout.

    Args:
        q: (batch, seqlen_q, nheads, headdim); k: (batch, seqlen_k, nheads_k, headdim), v:
            (batch, seqlen_k, nheads_k, headdim_v) with nheads a multiple of nheads_k
            (GQA/MQA). float32, float16 or bfloat16; headdim, headdim_v <= 256 (headdim_v may
            differ, as in MLA's 192 / 128).
        dropout_p: dropout probability on the attention probabilities (training only).
        softmax_scale: default 1 / sqrt(headdim).
        causal: causal mask aligned to the bottom-right corner of the score matrix: with
            seqlen_q=2, seqlen_k=5 (1 = visible)::

                1 1 1 1 0
                1 1 1 1 1

        window_size: (left, right): query i sees keys in
            [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]; -1 = unbounded.
        softcap: > 0 caps the scores: s = softcap * tanh(s / softcap).
        alibi_slopes: (nheads,) or (batch, nheads) float32: adds -slope * |i + seqlen_k -
            seqlen_q - j| to the score of query i and key j.
        deterministic: accepted for compatibility; the backward is always deterministic.
        return_attn_probs: also return the log-sum-exp and, with dropout, S_dmask: the
            softmax probabilities with dropped entries negative, as flash-attn (for tests and
            small shapes; None without dropout, as flash-attn).
        sinks: optional (nheads,) attention-sink logits (GPT-OSS): each joins its head's
            softmax denominators and contributes no value.

    A query row that sees no key returns zeros and an LSE of -inf (with a sink: the sink's
    logit). Few query rows per K/V head (without dropout) run the split-KV decode kernel.
    Differentiable in q, k, v and sinks.

    Returns:
        out (batch, seqlen_q, nheads, headdim_v); with return_attn_probs, (out, softmax_lse
        (batch, nheads, seqlen_q) float32, S_dmask (batch, nheads, seqlen_q, seqlen_k)
        float32 or None without dropout).
    """
    fn = "ipex_flash.flash_attn_func"
    if (dropout_p == 0.0 and type(window_size) is tuple
            and not fast_path.needs_dispatcher(q, k, v, alibi_slopes, sinks)):
        # Nothing for autograd or tracing: the launch plan of this signature (the op checks
        # the first call of each).
        def general():
            check_scale(fn, softmax_scale)
            left, right = check_window(fn, window_size)
            return torch.ops.ipex_flash.flash_attn_forward(
                q, k, v, None, None, 0, 0, softmax_scale, causal, left, right, float(softcap),
                alibi_slopes, 0.0, None, sinks)

        out, lse = fast_path.flash_forward(q, k, v, softmax_scale, causal, window_size, softcap,
                                           alibi_slopes, sinks, return_attn_probs, general)
        return (out, launch.natural_lse(lse), None) if return_attn_probs else out
    check_dropout_p(fn, dropout_p)
    check_scale(fn, softmax_scale)
    left, right = check_window(fn, window_size)
    seed = _seed(q, dropout_p)
    out, lse = torch.ops.ipex_flash.flash_attn_forward(
        q, k, v, None, None, 0, 0, softmax_scale, causal, left, right, float(softcap),
        alibi_slopes, float(dropout_p), seed, sinks)
    if not return_attn_probs:
        return out
    lse = launch.natural_lse(lse)
    probs = None if seed is None else attn_probs(
        fn, q, k, lse, softmax_scale, causal, left, right, float(softcap), alibi_slopes,
        dropout_p, seed)
    return out, lse, probs


def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                           max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           seqused_k=None, sinks=None, s_aux=None, out=None,
                           return_softmax_lse=False, q_descale=None, k_descale=None,
                           v_descale=None, scheduler_metadata=None, fa_version=2, num_splits=0):
    """flash_attn_func on packed sequences: q (total_q, nheads, headdim), k and v
    (total_k, nheads_k, headdim or headdim_v); sequence b is rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v
    (int32, shape (batch + 1,)); max_seqlen_q and max_seqlen_k bound the lengths. Masks and
    ALiBi are per sequence. Returns out (total_q, nheads, headdim_v), and with
    return_attn_probs (out, softmax_lse (nheads, total_q), S_dmask (batch, nheads,
    max_seqlen_q, max_seqlen_k), zero-padded, or None without dropout). sinks: as
    flash_attn_func.

    With block_table (batch, max_blocks) int32, k and v are a paged KV cache (num_blocks,
    page_size, nheads_k, headdim or headdim_v) and sequence b's keys are its first
    seqused_k[b] (or cu_seqlens_k[b+1] - cu_seqlens_k[b]) cache positions: the serving call,
    prefills and decodes mixed (kvcache/paged_varlen.py); no dropout, no backward. The cache
    may be FP8 (float8_e4m3fn, float8_e5m2) with k_descale, v_descale.

    The keywords vLLM's attention backend passes (flash-attn 2.8's signature is a prefix):
        out: (total_q, nheads, headdim_v), written in place and returned; any strides with a
            contiguous last dim (a slice of a larger buffer). With block_table the kernels
            write into it; without, the result is copied into it.
        s_aux: a second name for sinks.
        return_softmax_lse: return (out, softmax_lse (nheads, total_q) float32, natural log).
        q_descale, k_descale, v_descale: one value or (batch, nheads_k) each (vLLM's
            expanded views). q_descale goes with a float8_e4m3fn q (and an FP8 cache; q is
            widened to the output's dtype: out's if float16 or bfloat16, else bfloat16); with
            a 16-bit q it must be 1. With an FP8 cache
            the kernels apply k_descale and v_descale; with a 16-bit cache they are applied
            too, by scaling q before and the output after the kernels
            (kvcache/engine_args.py).
        scheduler_metadata: None; fa_version: 2; num_splits: 0 chooses, > 1 splits each
            sequence's keys in the decode kernel (a hint, clamped to one split per 16 keys).
    """
    fn = "ipex_flash.flash_attn_varlen_func"
    window_size = engine_args.as_window(window_size)
    softcap = 0.0 if softcap is None else softcap
    if s_aux is not None:
        sinks = engine_args.merged_sinks(fn, sinks, s_aux)
    if (out is not None or return_softmax_lse or q_descale is not None or k_descale is not None
            or v_descale is not None or scheduler_metadata is not None or fa_version != 2
            or num_splits != 0 or (isinstance(q, torch.Tensor) and fp8_quant.is_fp8(q))):
        return _engine_call(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                            return_attn_probs, block_table, seqused_k, sinks, out,
                            return_softmax_lse, q_descale, k_descale, v_descale,
                            scheduler_metadata, fa_version, num_splits,
                            lambda q_, want_lse: flash_attn_varlen_func(
                                q_, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                dropout_p, softmax_scale, causal, window_size, softcap,
                                alibi_slopes, deterministic, want_lse, seqused_k=seqused_k,
                                sinks=sinks))
    if block_table is not None:  # (it checks what this function checks below)
        out, lse = paged_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                     softcap, alibi_slopes, block_table, seqused_k, sinks,
                                     want_lse=return_attn_probs)
        return (out, lse, None) if return_attn_probs else out
    if (dropout_p == 0.0 and type(window_size) is tuple
            and type(max_seqlen_q) is int and type(max_seqlen_k) is int
            and cu_seqlens_q is not None and cu_seqlens_k is not None and seqused_k is None
            and not fast_path.needs_dispatcher(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                               alibi_slopes, sinks)):
        # Nothing for autograd or tracing: the launch plan of this signature (the op checks
        # the first call of each; the offsets are checked on every call).
        def general():
            check_scale(fn, softmax_scale)
            left, right = check_window(fn, window_size)
            return torch.ops.ipex_flash.flash_attn_forward(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                causal, left, right, float(softcap), alibi_slopes, 0.0, None, sinks)

        out, lse = fast_path.flash_forward(
            q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, sinks,
            return_attn_probs, general, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
        return (out, launch.natural_lse(lse), None) if return_attn_probs else out
    check_dropout_p(fn, dropout_p)
    check_scale(fn, softmax_scale)
    left, right = check_window(fn, window_size)
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError(f"{fn}: cu_seqlens_q and cu_seqlens_k are required without a "
                         "block_table")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        check_max_seqlen(fn, name, value)
    if seqused_k is not None:
        raise ValueError(f"{fn}: seqused_k is taken with a paged KV cache (block_table)")
    seed = _seed(q, dropout_p)
    out, lse = torch.ops.ipex_flash.flash_attn_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
        softmax_scale, causal, left, right, float(softcap), alibi_slopes, float(dropout_p),
        seed, sinks)
    if not return_attn_probs:
        return out
    lse = launch.natural_lse(lse)
    probs = None if seed is None else attn_probs(
        fn, q, k, lse, softmax_scale, causal, left, right, float(softcap), alibi_slopes,
        dropout_p, seed, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k))
    return out, lse, probs
