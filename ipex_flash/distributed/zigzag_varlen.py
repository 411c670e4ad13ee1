"""Zigzag ring attention over packed sequences, ring-flash-attention's
zigzag_ring_flash_attn_varlen_func: every sequence of the batch is cut into 2P equal chunks
and rank r holds chunks r and 2P-1-r of each (zigzag_varlen_shard), packed sequence after
sequence, with local offsets cu_seqlens // P identical on every rank. Causal work is balanced
across ranks within every sequence, as zigzag_ring_flash_attn_func balances one sequence.

The front halves (chunk r of every sequence) and back halves (chunk 2P-1-r) are gathered into
two blocks, [fronts | backs], once per call: each block is then packed by the same offsets,
cu_seqlens // 2, and every kernel call of the ring is one half-block against another with
those offsets. The causal plan against the shard of rank o, per sequence:

    o == r:  front x front causal, back x back causal, back x front full
    o <  r:  front x front full, back x front full     (o's back chunk is later than both)
    o >  r:  back x front full, back x back full       (r's front chunk is earlier than both)

Without causal the layout does not matter (every key is seen), and the call is the packed
ring's.
"""
from __future__ import annotations

import torch

from ipex_flash.distributed._blocks import BlockCall
from ipex_flash.distributed._ring_engine import RingAttention, RingProblem
from ipex_flash.distributed.varlen import packed_setup, varlen_ring
from ipex_flash.ops.launch import natural_lse

Tensor = torch.Tensor


def _plans(rank: int, world: int, rows: int) -> list[list[BlockCall]]:
    """Calls over [fronts | backs] rows (rows: the real rows, cu_seqlens[-1])."""
    front, back = (0, rows // 2), (rows // 2, rows)
    full, causal = (-1, -1), (-1, 0)
    plans = []
    for owner in range(world):
        if owner == rank:
            plans.append([BlockCall(front, front, causal), BlockCall(back, back, causal),
                          BlockCall(back, front, full)])
        elif owner < rank:
            plans.append([BlockCall(front, front, full), BlockCall(back, front, full)])
        else:
            plans.append([BlockCall(back, front, full), BlockCall(back, back, full)])
    return plans


def _halves(fn: str, learned: dict, device: torch.device) -> dict:
    """The gather from packed order to [fronts | backs] and its inverse, and the halves'
    offsets: computed on the first call for this cu_seqlens, kept with what the group agreed
    on (so a warm call reads nothing to the host)."""
    if "halves" not in learned:
        offsets = learned["offsets"]
        odd = [b - a for a, b in zip(offsets, offsets[1:]) if (b - a) % 2]
        if odd:  # offsets agree between ranks, so every rank raises here alike
            raise ValueError(
                f"{fn}: every sequence's local length must be even (two equal chunks of it, "
                f"so every global length a multiple of 2 * world_size), got {odd} in "
                "cu_seqlens (shard with ipex_flash.distributed.zigzag_varlen_shard)")
        fronts = [torch.arange(a, (a + b) // 2) for a, b in zip(offsets, offsets[1:])]
        backs = [torch.arange((a + b) // 2, b) for a, b in zip(offsets, offsets[1:])]
        order = torch.cat(fronts + backs) if offsets[-1] else torch.zeros(0, dtype=torch.long)
        learned["halves"] = {
            "order": order.to(device), "inverse": torch.argsort(order).to(device),
            "cu": torch.tensor([o // 2 for o in offsets], dtype=torch.int32, device=device)}
    return learned["halves"]


def _pad_rows(t: Tensor, rows: int, dim: int, fill) -> Tensor:
    """t with rows along dim up to `rows`, the new ones `fill` (differentiable in t)."""
    missing = rows - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    pad = fill(shape) if callable(fill) else t.new_full(shape, fill)
    return torch.cat([t, pad], dim=dim)


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
        window_size: must be (-1, -1) (NotImplementedError: the two chunks of sequences of
            different lengths sit at different global distances, which one kernel call's
            window cannot express).
        dropout_p, softmax_scale, alibi_slopes, deterministic, group, softcap, sinks: as
            ring_flash_attn_func.
        return_attn_probs: also return the LSE (nheads, total_local) float32, natural log,
            and None.

    Rows past cu_seqlens[-1] (padding) belong to no sequence: they are never read, their
    output is 0, their LSE -inf (the sink's logit with sinks), their gradients 0.

    Returns:
        out (total_local, nheads, headdim_v), or (out, lse, None).
    """
    fn = "ipex_flash.distributed.zigzag_ring_flash_attn_varlen_func"
    scale, learned = packed_setup(fn, q, k, v, cu_seqlens, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, alibi_slopes, group,
                                  softcap, sinks)
    if not causal:
        return varlen_ring(fn, q, k, v, cu_seqlens, max_seqlen, scale, learned, False,
                           softcap, sinks, return_attn_probs)
    halves = _halves(fn, learned, q.device)
    comm, rows = learned["comm"], learned["offsets"][-1]
    # Only the real rows are gathered: padding past cu_seqlens[-1] is never read.
    q_h, k_h, v_h = (t.index_select(0, halves["order"]) for t in (q, k, v))
    problem = RingProblem(comm, _plans(comm.rank, comm.size, rows), [rows] * comm.size, scale,
                          float(softcap), varlen=(halves["cu"], int(max_seqlen) // 2))
    out_h, lse_h = RingAttention.apply(q_h, k_h, v_h, sinks, problem)
    out = _pad_rows(out_h.index_select(0, halves["inverse"]), q.shape[0], 0, 0.0)
    if not return_attn_probs:
        return out
    lse = natural_lse(lse_h).index_select(1, halves["inverse"])
    no_rows = (lambda shape: sinks.detach().float()[:, None].expand(shape).clone()
               ) if sinks is not None else float("-inf")
    return out, _pad_rows(lse, q.shape[0], 1, no_rows), None
