"""Ring attention over packed sequences, with ring-flash-attention's ring_flash_attn_varlen_func:
every rank holds the p-th contiguous slice of every sequence of the batch (varlen_shard),
packed as flash-attn's varlen functions take them, with the same local cu_seqlens on every
rank. The ring engine is the fixed-length one (_ring_engine.py), run inside the torch ops of
_varlen_op.py; each step is one varlen kernel call over all sequences.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ipex_flash.distributed import _varlen_op  # noqa: F401  (registers the ops)
from ipex_flash.distributed._checks import check_local
from ipex_flash.distributed._comm import resolve_group
from ipex_flash.ops.launch import draw_dropout_seed, natural_lse
from ipex_flash.ops.validation import check_cu_seqlens, check_max_seqlen

Tensor = torch.Tensor


def packed_checks(fn: str, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen,
                  dropout_p, softmax_scale, window_size, alibi_slopes, group, softcap,
                  sinks) -> tuple[dist.ProcessGroup, float, tuple[int, int]]:
    """This rank's checks of a packed ring call, nothing read from the device (the offsets'
    values are read and compared between ranks once per tensor, in _varlen_op.py): returns
    (the group, the softmax scale, the window)."""
    group = resolve_group(fn, group)
    scale, window = check_local(fn, q, k, v, dropout_p, softmax_scale, window_size, softcap,
                                alibi_slopes, sinks, packed=True, placed=True)
    check_cu_seqlens(fn, "cu_seqlens", cu_seqlens, q.shape[0], q.device, False)
    check_max_seqlen(fn, "max_seqlen", max_seqlen)
    return group, scale, window


def packed_ring(fn: str, kind: str, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor,
                max_seqlen, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                return_attn_probs, group, softcap, sinks):
    """The checks, then the ring as one torch op (torch.compile keeps it in its graph).
    kind: "contiguous" or "zigzag", the layout of each sequence's shards."""
    group, scale, window = packed_checks(fn, q, k, v, cu_seqlens, max_seqlen, dropout_p,
                                         softmax_scale, window_size, alibi_slopes, group,
                                         softcap, sinks)
    backward_follows = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, sinks))
    # One draw per call, as flash_attn_varlen_func makes: ranks seeded alike keep what it keeps.
    seed = draw_dropout_seed(q.device) if dropout_p > 0.0 else None
    out, lse = torch.ops.ipex_flash.ring_varlen_attention(
        q, k, v, sinks, alibi_slopes, seed, cu_seqlens, max_seqlen, group.group_name, fn, kind,
        bool(causal), window[0], window[1], scale, float(softcap), float(dropout_p),
        backward_follows)
    return (out, natural_lse(lse), None) if return_attn_probs else out


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0,
                                softmax_scale=None, causal=False, window_size=(-1, -1),
                                alibi_slopes=None, deterministic=False, return_attn_probs=False,
                                group=None, *, softcap=0.0, sinks=None):
    """Attention over packed sequences, each split evenly across the ranks of `group`.

    Args:
        q: (total_local, nheads, headdim); k: (total_local, nheads_k, headdim), v:
            (total_local, nheads_k, headdim_v). Sequence b's local tokens are rows
            cu_seqlens[b]:cu_seqlens[b+1], the p-th of P equal slices of the whole sequence on
            rank p (ipex_flash.distributed.varlen_shard makes them).
        cu_seqlens: (batch + 1,) int32, the local offsets, identical on every rank. Its
            values are read and compared between ranks the first time this tensor object is
            passed (and after it is modified in place), not on every call.
        max_seqlen: the longest local slice.
        causal: as ring_flash_attn_func (the plain ring: rank p does about (2p + 1) / P^2 of
            the work).
        window_size: (left, right) in each sequence's global positions, as
            ring_flash_attn_func (every call is placed at its sequences' global positions).
        dropout_p, softmax_scale, alibi_slopes, deterministic, group, softcap, sinks: as
            ring_flash_attn_func (dropout as flash_attn_varlen_func's over the whole batch;
            alibi_slopes (nheads,) only).
        return_attn_probs: also return the LSE (nheads, total_local) float32, natural log,
            and None.

    Rows past cu_seqlens[-1] (padding) belong to no sequence: they are never read (NaN there
    is harmless), their output is 0, their LSE -inf (the sink's logit with sinks), their
    gradients 0, and they add nothing to the sinks' gradient.

    Returns:
        out (total_local, nheads, headdim_v), or (out, lse, None).
    """
    return packed_ring("ipex_flash.distributed.ring_flash_attn_varlen_func", "contiguous", q,
                       k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal,
                       window_size, alibi_slopes, return_attn_probs, group, softcap, sinks)
