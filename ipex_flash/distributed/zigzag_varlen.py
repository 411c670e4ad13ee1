"""Zigzag ring attention over packed sequences, ring-flash-attention's
zigzag_ring_flash_attn_varlen_func: every sequence of the batch is cut into 2P equal chunks
and rank r holds chunks r and 2P-1-r of each (zigzag_varlen_shard), packed sequence after
sequence, with local offsets cu_seqlens // P identical on every rank. Causal work is balanced
across ranks within every sequence, as zigzag_ring_flash_attn_func balances one sequence.

The ring's plan for this layout is in _varlen_op.py (the front and back halves of every
sequence gathered into two blocks, each packed by cu_seqlens // 2). Without causal the layout
does not matter (every key is seen) and the plan is the packed ring's.
"""
from __future__ import annotations

from ipex_flash.distributed.varlen import packed_ring


def zigzag_ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0,
                                       softmax_scale=None, causal=False, window_size=(-1, -1),
                                       alibi_slopes=None, deterministic=False,
                                       return_attn_probs=False, group=None, *, softcap=0.0,
                                       sinks=None):
    """Attention over packed sequences, each zigzag-sharded across the ranks of `group`.

    Args:
        q: (total_local, nheads, headdim); k: (total_local, nheads_k, headdim), v:
            (total_local, nheads_k, headdim_v). Sequence b's local tokens are rows
            cu_seqlens[b]:cu_seqlens[b+1]: chunk r of its 2P equal chunks, then chunk
            2P-1-r (ipex_flash.distributed.zigzag_varlen_shard makes them).
        cu_seqlens: (batch + 1,) int32, the local offsets (the whole batch's // P), identical
            on every rank; every local length even. Read and compared between ranks the
            first time this tensor object is passed, not on every call.
        max_seqlen: the longest local sequence (the whole batch's longest // P).
        causal: the mask of each whole sequence; every rank does the same work. Without
            causal (which ring-flash-attention asserts against) the result is the same
            attention over every key of each sequence.
        window_size: (left, right) in each sequence's global positions (every call is
            placed at its sequences' global positions).
        dropout_p, softmax_scale, alibi_slopes, deterministic, group, softcap, sinks: as
            ring_flash_attn_func.
        return_attn_probs: also return the LSE (nheads, total_local) float32, natural log,
            and None.

    Rows past cu_seqlens[-1] (padding) belong to no sequence: they are never read, their
    output is 0, their LSE -inf (the sink's logit with sinks), their gradients 0.

    Returns:
        out (total_local, nheads, headdim_v), or (out, lse, None).
    """
    return packed_ring("ipex_flash.distributed.zigzag_ring_flash_attn_varlen_func", "zigzag",
                       q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal,
                       window_size, alibi_slopes, return_attn_probs, group, softcap, sinks)
