"""Ring attention over packed sequences, with ring-flash-attention's ring_flash_attn_varlen_func:
every rank holds the p-th contiguous slice of every sequence of the batch (varlen_shard),
packed as flash-attn's varlen functions take them, with the same local cu_seqlens on every
rank. The ring engine is the fixed-length one (_ring_engine.py); each step is one varlen
kernel call over all sequences.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ipex_flash.distributed._agreement import agreed
from ipex_flash.distributed._blocks import BlockCall
from ipex_flash.distributed._checks import AGREED, check_local, shape_signature
from ipex_flash.distributed._comm import RingComm, check_same, gather_ints, resolve_group
from ipex_flash.distributed._ring_engine import RingAttention, RingProblem
from ipex_flash.ops.launch import natural_lse
from ipex_flash.ops.validation import check_cu_seqlens, check_max_seqlen

Tensor = torch.Tensor


def _plans(rank: int, world: int, rows: int, causal: bool) -> list[list[BlockCall]]:
    """Rank r's slice of each sequence follows those of ranks < r: their keys are all
    visible, its own are causal, later ranks' hidden (with causal). rows: cu_seqlens[-1];
    the calls never see the rows after it, which the kernels would leave unwritten and the
    merge would then read."""
    whole = (0, rows)
    plans = []
    for owner in range(world):
        if causal and owner > rank:
            plans.append([])
        else:
            right = 0 if causal and owner == rank else -1
            plans.append([BlockCall(whole, whole, (-1, right))])
    return plans


def _learn(fn: str, signature: list[int], batch: int, cu_seqlens: Tensor, max_seqlen: int,
           total: int, group: dist.ProcessGroup) -> dict:
    """This rank's offsets, checked, and every rank's agreement: once per cu_seqlens tensor
    and arguments (_agreement.py), the only place the offsets are read to the host."""
    check_cu_seqlens(fn, "cu_seqlens", cu_seqlens, total, cu_seqlens.device, True)
    offsets = cu_seqlens.tolist()
    longest = max(b - a for a, b in zip(offsets, offsets[1:]))
    if longest > max_seqlen:
        raise ValueError(f"{fn}: a sequence has {longest} local tokens, more than "
                         f"max_seqlen={max_seqlen}")
    gathered = gather_ints(signature + [batch], cu_seqlens.device, group)
    check_same(fn, gathered, ("total_local tokens", *AGREED, "batch (len(cu_seqlens) - 1)"))
    # The same local offsets on every rank: slice p of each sequence at a known place.
    check_same(fn, gather_ints(offsets, cu_seqlens.device, group),
               [f"cu_seqlens[{i}]" for i in range(batch + 1)])
    return {"comm": RingComm(group), "offsets": offsets}


def packed_setup(fn: str, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen,
                 dropout_p, softmax_scale, causal, window_size, alibi_slopes, group, softcap,
                 sinks) -> tuple[float, dict]:
    """The checks of a packed ring call: returns (the softmax scale, what the group agreed on
    for these arguments and this cu_seqlens: {"comm", "offsets", and what callers derive})."""
    group = resolve_group(fn, group)
    scale, window = check_local(fn, q, k, v, dropout_p, softmax_scale, window_size, softcap,
                                alibi_slopes, sinks, packed=True)
    if window != (-1, -1):
        raise NotImplementedError(
            f"{fn}: window_size {tuple(window_size)} is not supported with packed sequences: "
            "the shards of each sequence sit at their own global offsets, which one kernel "
            "call's window cannot express (ring_flash_attn_func, zigzag_ring_flash_attn_func "
            "and stripe_flash_attn_func take windows)")
    # Shape, dtype and device only here: the values are read once, in _learn.
    batch = check_cu_seqlens(fn, "cu_seqlens", cu_seqlens, q.shape[0], q.device, False)
    check_max_seqlen(fn, "max_seqlen", max_seqlen)
    signature = shape_signature(q, k, v, causal, window, softcap, sinks, True)
    learned = agreed(group, (fn, *signature, batch, max_seqlen), (cu_seqlens,),
                     lambda: _learn(fn, signature, batch, cu_seqlens, max_seqlen, q.shape[0],
                                    group))
    return scale, learned


def varlen_ring(fn: str, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                scale: float, learned: dict, causal: bool, softcap, sinks,
                return_attn_probs: bool):
    """The ring over packed sequences sliced contiguously (or any layout whose non-causal
    attention is the same: every rank's keys all visible)."""
    comm = learned["comm"]
    rows = learned["offsets"][-1]
    problem = RingProblem(comm, _plans(comm.rank, comm.size, rows, bool(causal)),
                          [q.shape[0]] * comm.size, scale, float(softcap),
                          varlen=(cu_seqlens.contiguous(), int(max_seqlen)), packed_rows=rows)
    out, lse = RingAttention.apply(q, k, v, sinks, problem)
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
        window_size: must be (-1, -1) (NotImplementedError: one call's window cannot place
            the shards of sequences of different lengths).
        dropout_p, softmax_scale, alibi_slopes, deterministic, group, softcap, sinks: as
            ring_flash_attn_func.
        return_attn_probs: also return the LSE (nheads, total_local) float32, natural log,
            and None.

    Rows past cu_seqlens[-1] (padding) belong to no sequence: they are never read (NaN there
    is harmless), their output is 0, their LSE -inf (the sink's logit with sinks), their
    gradients 0, and they add nothing to the sinks' gradient.

    Returns:
        out (total_local, nheads, headdim_v), or (out, lse, None).
    """
    fn = "ipex_flash.distributed.ring_flash_attn_varlen_func"
    scale, learned = packed_setup(fn, q, k, v, cu_seqlens, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, alibi_slopes, group,
                                  softcap, sinks)
    return varlen_ring(fn, q, k, v, cu_seqlens, max_seqlen, scale, learned, causal, softcap,
                       sinks, return_attn_probs)
