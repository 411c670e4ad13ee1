"""flash_attn_varlen_func's call as vLLM's attention backend makes it: out= written in place,
return_softmax_lse, descales, scheduling hints (kvcache/engine_args.py), over a paged cache
(the kernels write into out) or packed contiguous keys (the result is copied into out)."""
from __future__ import annotations

from typing import Callable

import torch

from ipex_flash.kvcache import engine_args
from ipex_flash.kvcache.paged_varlen import paged_varlen_func

Tensor = torch.Tensor


def engine_call(fn: str, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                return_attn_probs, block_table, seqused_k, sinks, out, return_softmax_lse,
                q_descale, k_descale, v_descale, scheduler_metadata, fa_version, num_splits,
                plain_call: Callable):
    """plain_call(q, want_lse): flash_attn_varlen_func's own path over contiguous keys, with
    return_attn_probs=want_lse."""
    engine_args.check_hints(fn, scheduler_metadata, fa_version, num_splits)
    if return_attn_probs and return_softmax_lse:
        raise ValueError(f"{fn}: give return_softmax_lse (out, lse) or return_attn_probs "
                         "(out, lse, S_dmask), not both")
    if not isinstance(q, Tensor) or q.dim() != 3:
        raise ValueError(f"{fn}: q must be (total_q, nheads, headdim), got "
                         f"{tuple(q.shape) if isinstance(q, Tensor) else type(q).__name__}")
    if not isinstance(cu_seqlens_q, Tensor) or cu_seqlens_q.dim() != 1:
        raise ValueError(f"{fn}: cu_seqlens_q must be a (batch + 1,) int32 tensor")
    if not isinstance(k, Tensor) or not isinstance(v, Tensor) or k.dim() < 3 or v.dim() < 3:
        raise ValueError(f"{fn}: k and v must be tensors (total_k or pages, [page_size,] "
                         "nheads_k, headdim)")
    if block_table is None and cu_seqlens_k is None:
        raise ValueError(f"{fn}: cu_seqlens_k is required without a block_table (with one, "
                         "seqused_k gives each sequence's keys)")
    descaled = engine_args.apply_descales(fn, q, k.dtype, q_descale, k_descale, v_descale,
                                          cu_seqlens_q.shape[0] - 1, k.shape[-2], cu_seqlens_q,
                                          out_dtype=getattr(out, "dtype", None))
    if out is not None:
        engine_args.check_out(fn, out, (q.shape[0], q.shape[1], v.shape[-1]), descaled.q.dtype,
                              q.device)
    want_lse = return_attn_probs or return_softmax_lse
    probs = None
    if block_table is not None:
        result, lse = paged_varlen_func(
            descaled.q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size, softcap, alibi_slopes, block_table, seqused_k,
            sinks, descaled.k_descale, descaled.v_descale, out, num_splits, want_lse)
    else:
        result = plain_call(descaled.q, want_lse)
        if want_lse:
            result, lse, probs = result
        if out is not None:
            result = out.copy_(result)
    result = descaled.scaled(result, in_place=out is not None or block_table is not None)
    if return_softmax_lse:
        return result, lse
    return (result, lse, probs) if return_attn_probs else result
