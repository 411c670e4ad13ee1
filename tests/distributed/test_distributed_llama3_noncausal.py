"""Windows and ALiBi without causal in llama3_flash_attn_varlen_func at 2 and 4 gloo ranks on
the SYCL CPU device. Without causal the keys of a rank's last sequence run past its queries,
so each call is placed at its sequences' global positions and the kernels measure the window
and ALiBi's distances from each sequence's own diagonal: output, LSE and gradients against
one process's flash_attn_varlen_func over the whole packed batch and against float64, with
two-sided and one-sided windows, (nheads,) and (batch, nheads) slopes, sequences crossing
rank boundaries and several heads_k_stride groups."""
from helpers import distributed_cases as dc
from llama3_cases import compare_slice
import pytest
import torch

from ipex_flash.distributed.llama3 import (
    llama3_flash_attn_prepare_cu_seqlens, llama3_flash_attn_varlen_func)

F32 = torch.float32


def _slopes(alibi, batch, heads):
    """None, (nheads,) or (batch, nheads) slopes of the whole batch (drawn alike on every
    rank, after dc.draw has seeded)."""
    if alibi == "heads":
        return torch.rand(heads) * 0.3
    return torch.rand(batch, heads) * 0.3 if alibi == "batch" else None


def _local_slopes(slopes, cu, start, batch):
    """This rank's rows of (batch, nheads) slopes: its local sequence b is the whole batch's
    sequence first + b, first being the one its token `start` belongs to (no empty
    sequences here)."""
    if slopes is None or slopes.dim() == 1:
        return slopes
    first = sum(end <= start for end in cu.tolist()[1:])
    return slopes[first:first + batch].contiguous()


def _references(q, k, v, grad_out, window, slopes, cu):
    """{precision: [out, dq, dk, dv]} of non-causal attention one sequence at a time in
    float64 (the truth) and float32, each sequence with its own row of (batch, nheads)
    slopes."""
    wants = {}
    bounds = list(zip(cu.tolist(), cu.tolist()[1:]))
    for precision in (torch.float64, F32):
        ref = dc._leaves(*(t.to(precision) for t in (q, k, v)))
        rows = [slopes if slopes is None or slopes.dim() == 1 else slopes[b:b + 1]
                for b in range(len(bounds))]
        out = torch.cat([dc.reference(*(t[a:e].unsqueeze(0) for t in ref), False, window,
                                      0.0, None, rows[b], precision)[0]
                         for b, (a, e) in enumerate(bounds)])
        out.backward(grad_out.to(precision))
        wants[precision] = [out] + [t.grad for t in ref]
    return wants


def noncausal_case(rank, world, lengths, heads, stride, window, alibi):
    """This rank's slice of the packed stream without causal, against one process and
    float64: distributed_cases' result dict."""
    total = sum(lengths)
    q, k, v, grad_out, _ = dc.draw((total,), heads, 32, F32)
    slopes = _slopes(alibi, len(lengths), heads[0])
    cu = dc.cu_seqlens(lengths)
    n = total // world
    cut = lambda t: t[rank * n:(rank + 1) * n]  # noqa: E731

    cu_q, cu_k, max_q, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(cu, False, rank,
                                                                             world)
    local = dc._leaves(*(cut(t) for t in (q, k, v)))
    mine = _local_slopes(slopes, cu, rank * n, len(cu_q) - 1)
    out, lse, _ = llama3_flash_attn_varlen_func(*local, cu_q, cu_k, max_q, max_k, stride,
                                                k_slice, causal=False, window_size=window,
                                                alibi_slopes=mine, return_attn_probs=True)
    out.backward(cut(grad_out))
    got = [out, lse] + [t.grad for t in local]
    options = dict(causal=False, window_size=window, alibi_slopes=slopes)
    singles, single_lse = dc.one_process_varlen(q, k, v, None, grad_out, lengths,
                                                with_lse=True, **options)
    wants = _references(q, k, v, grad_out, window, slopes, cu)
    return compare_slice(got, singles, single_lse, wants, rank, n)


# 70 tokens: the rank boundary (35) falls inside sequence 1, whose keys on rank 0 run 13
# tokens past its queries.
LENGTHS = [13, 29, 1, 27]


@pytest.mark.parametrize("heads,stride,window,alibi", [
    ((4, 2), 1, (5, 7), None),      # a two-sided window, two head groups
    ((4, 2), 1, (-1, 6), None),     # only a right bound: keys past the rank's queries
    ((6, 3), 1, (-1, -1), "heads"),  # ALiBi alone, three groups
    ((8, 4), 2, (9, 3), "batch"),   # both, per-sequence slopes, two groups of two K/V heads
])
def test_two_ranks(world2, heads, stride, window, alibi):
    dc.check_errors(world2.run(noncausal_case, lengths=LENGTHS, heads=heads, stride=stride,
                               window=window, alibi=alibi), F32)


# 84 tokens, 21 per rank: sequence 1 spans ranks 0 to 2, rank 3 begins inside sequence 2.
LENGTHS_4 = [3, 51, 17, 1, 12]


@pytest.mark.parametrize("heads,stride,window,alibi", [
    ((4, 2), 1, (6, 6), "batch"),
    ((8, 4), 2, (-1, -1), "heads"),
    ((4, 2), 1, (30, 2), None),  # a window wider than a rank's slice
])
def test_four_ranks(world4, heads, stride, window, alibi):
    dc.check_errors(world4.run(noncausal_case, lengths=LENGTHS_4, heads=heads, stride=stride,
                               window=window, alibi=alibi), F32)
