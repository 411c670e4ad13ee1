"""Ring attention over stripe shards, ring-flash-attention's stripe_flash_attn_func: token t
of the sequence is on rank t mod P (stripe_shard), so every rank holds tokens from the whole
length and causal work is balanced without zigzag's two chunks. The engine and checks are
the ring's (ring.py); only the plan differs (_blocks.stripe_pair).
"""
from __future__ import annotations

from ipex_flash.distributed.ring import _ring_attention


def stripe_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, group=None, *, softcap=0.0, sinks=None):
    """Causal attention over a sequence striped across the ranks of `group`: rank p holds
    tokens p, p + P, p + 2P, ... of q, k and v, in that order (what
    ipex_flash.distributed.stripe_shard gives; a length that P does not divide leaves the
    first N mod P ranks one token more). With P = 2, rank 0 holds tokens 0, 2, 4, ... and
    rank 1 tokens 1, 3, 5, ...; each step is one kernel call, causal on its own diagonal
    against ranks up to its own and shifted by one (its queries from the second, the other
    rank's keys up to the last but one) against later ranks.

    causal must be True, as in ring-flash-attention, whose stripe function asserts it: the
    layout exists to balance causal attention (without causal, use ring_flash_attn_func);
    causal=False raises a ValueError naming it.

    window_size: (left, right) in global positions, as ring_flash_attn_func (each step's
    band in local positions follows from the stripe). ring-flash-attention passes the window
    to each call unchanged, in local positions, which is not the global window.

    Other arguments and the result as ring_flash_attn_func: GQA, softcap and sinks compose;
    alibi_slopes and dropout_p > 0 are refused (NotImplementedError).
    """
    fn = "ipex_flash.distributed.stripe_flash_attn_func"
    if not causal:
        raise ValueError(
            f"{fn}: causal=False is not supported (nor in ring-flash-attention): the stripe "
            "layout balances causal attention; without causal use ring_flash_attn_func, whose "
            "work is balanced already")
    return _ring_attention(fn, "stripe", q, k, v, dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, return_attn_probs, group, sinks)
