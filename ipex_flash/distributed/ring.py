"""Ring attention with ring-flash-attention's names, arguments and (batch, seqlen_local,
nheads, headdim) layout: each rank of `group` holds one shard of the sequence (q, k and v
alike) and gets the attention of its queries over the whole sequence. The engine is
_ring_engine.py, the plan of kernel calls _blocks.py, the torch op around them _ring_op.py.

    from ipex_flash.distributed import ring_flash_attn_func, zigzag_ring_flash_attn_func
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ipex_flash.distributed import _ring_op  # noqa: F401  (registers ipex_flash::ring_attention)
from ipex_flash.distributed._checks import check_local
from ipex_flash.distributed._comm import resolve_group
from ipex_flash.ops.launch import draw_dropout_seed, natural_lse

Tensor = torch.Tensor


def _ring_attention(fn: str, kind: str, q: Tensor, k: Tensor, v: Tensor, dropout_p: float,
                    softmax_scale: Optional[float], causal: bool, window_size, softcap: float,
                    alibi_slopes: Optional[Tensor], return_attn_probs: bool,
                    group: Optional[dist.ProcessGroup], sinks: Optional[Tensor],
                    heads: tuple[int, int] = (0, 0)):
    """This rank's checks, then the ring as one torch op (_ring_op.py: every rank's agreement
    the first time, the plan, the ring), which torch.compile keeps whole in its graph.
    kind: "contiguous", "zigzag" or "stripe", the shards' layout. heads: (global query head
    of q's head 0, the whole problem's query heads) when q holds a slice of the heads (USP),
    at which dropout draws; (0, 0): all of them."""
    group = resolve_group(fn, group)
    scale, window = check_local(fn, q, k, v, dropout_p, softmax_scale, window_size, softcap,
                                alibi_slopes, sinks, packed=False, placed=kind != "stripe")
    backward_follows = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, sinks))
    # One draw per call, as flash_attn_func makes: ranks seeded alike keep what it keeps.
    seed = draw_dropout_seed(q.device) if dropout_p > 0.0 else None
    out, lse = torch.ops.ipex_flash.ring_attention(
        q, k, v, sinks, alibi_slopes, seed, group.group_name, fn, kind, bool(causal), window[0],
        window[1], scale, float(softcap), float(dropout_p), heads[0], heads[1],
        backward_follows)
    return (out, natural_lse(lse), None) if return_attn_probs else out


def ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                         window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                         return_attn_probs=False, group=None, *, softcap=0.0, sinks=None):
    """Attention over a sequence sharded contiguously across the ranks of `group`: rank p
    holds tokens [n_0 + ... + n_{p-1}, ... + n_p) of q, k and v. Shards may differ in
    length (every rank learns the others' lengths from one small all_gather, the first
    time it sees its arguments: see docs/distributed_internals.md on
    IPEX_FLASH_DISTRIBUTED_CHECKS).

    Args:
        q: (batch, seqlen_local, nheads, headdim); k: (batch, seqlen_local, nheads_k,
            headdim), v: (batch, seqlen_local, nheads_k, headdim_v), nheads a multiple of
            nheads_k (GQA/MQA); float32, float16 or bfloat16, on the group's device (CPU
            tensors with gloo, XPU with xccl). Each rank's q, k and v hold the same tokens.
        dropout_p: as flash_attn_func, with the very keep-mask one process's call over the
            whole sequence draws: each block is drawn at its global positions, from one seed
            per call drawn from torch's generator (seed every rank alike).
        softmax_scale: default 1 / sqrt(headdim).
        causal: each token sees itself and the tokens before it in the whole sequence. K/V
            shards of later ranks are skipped, so rank p does about (2p + 1) / P^2 of the
            work; zigzag_ring_flash_attn_func balances it.
        window_size: (left, right) in global positions: token p sees [p - left, p + right]
            (-1 unbounded; causal sets right to 0). Shards outside a rank's window are
            skipped, and when the window keeps some ranks apart, K/V go only to the ranks
            whose queries see them (_window_exchange.py) rather than around the ring.
        alibi_slopes: (nheads,) or (batch, nheads) float32: -slope * |i - j| in global
            positions, as one process's call over the whole sequence.
        deterministic: accepted; the result is always deterministic.
        return_attn_probs: also return the LSE (batch, nheads, seqlen_local) float32,
            natural log, and None (no probabilities), as ring-flash-attention.
        group: the process group (default: the world).
        softcap: > 0 caps the scores, softcap * tanh(s / softcap).
        sinks: (nheads,) attention-sink logits; each joins its head's softmax denominator
            once. Its gradient is this rank's part, to be summed over the group like other
            replicated parameters' (DDP/FSDP do).

    Every rank must call with the same shapes (except the local length), dtype and options; a
    difference raises a ValueError on every rank, checked the first time a rank sees its
    arguments (IPEX_FLASH_DISTRIBUTED_CHECKS=1: every call). Differentiable in q, k, v and
    sinks.

    Returns:
        out (batch, seqlen_local, nheads, headdim_v), or (out, lse, None).
    """
    return _ring_attention("ipex_flash.distributed.ring_flash_attn_func", "contiguous", q, k,
                           v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, return_attn_probs, group, sinks)


def zigzag_ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                                window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                                return_attn_probs=False, group=None, *, softcap=0.0,
                                sinks=None):
    """ring_flash_attn_func over zigzag shards, which balance causal attention: the sequence
    is cut into 2P chunks and rank r holds chunks r and 2P-1-r, in that order (what
    ipex_flash.distributed.zigzag_shard gives; torch's context_parallel shards its buffers
    the same way). With P = 2 and 8 tokens in chunks of 2, rank 0 holds tokens 0, 1, 6, 7
    and rank 1 tokens 2, 3, 4, 5; the causal mask of each rank's rows (1 = visible)::

                  key 0 1 2 3 4 5 6 7
        rank 0  q 0   1 0 0 0 0 0 0 0
                  1   1 1 0 0 0 0 0 0
                  6   1 1 1 1 1 1 1 0
                  7   1 1 1 1 1 1 1 1      18 pairs
        rank 1  q 2   1 1 1 0 0 0 0 0
                  3   1 1 1 1 0 0 0 0
                  4   1 1 1 1 1 0 0 0
                  5   1 1 1 1 1 1 0 0      18 pairs

    Each step against another rank's shard is one kernel call over half of one side: with
    chunks of equal length, every rank attends to the same number of (query, key) pairs.
    A sequence that 2P does not divide is cut into chunks whose lengths differ by one.
    Arguments and result as ring_flash_attn_func.
    """
    return _ring_attention("ipex_flash.distributed.zigzag_ring_flash_attn_func", "zigzag", q,
                           k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, return_attn_probs, group, sinks)
