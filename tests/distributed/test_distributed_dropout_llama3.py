"""Dropout with llama3_flash_attn_varlen_func at 2 and 4 gloo ranks on the SYCL CPU device.
Each rank's calls are placed at its sequences' indices in the whole batch (a rank's first
sequence may have begun on the rank before), their queries' positions in their sequences,
and each heads_k_stride group's first query head, so a sharded call keeps exactly what one
process's flash_attn_varlen_func keeps for the same seed: output, LSE and gradients against
float64 attention with that keep-mask and against that call itself."""
from dropout_cases import P, SEED, keep_mask, references
from helpers import distributed_cases as dc
from llama3_cases import compare_slice
import pytest
import torch

import ipex_flash
from ipex_flash.distributed.llama3 import (
    llama3_flash_attn_prepare_cu_seqlens, llama3_flash_attn_varlen_func)

F32 = torch.float32


def llama3_case(rank, world, causal, lengths, heads=(4, 2), stride=1, window=(-1, -1),
                alibi=False):
    """This rank's slice of the packed stream with dropout, against one process and
    float64: distributed_cases' result dict."""
    total, longest = sum(lengths), max(lengths)
    q, k, v, grad_out, _ = dc.draw((total,), heads, 32, F32)
    slopes = torch.rand(heads[0]) * 0.3 if alibi else None
    cu = dc.cu_seqlens(lengths)
    n = total // world
    cut = lambda t: t[rank * n:(rank + 1) * n]  # noqa: E731
    options = dict(dropout_p=P, causal=causal, window_size=window, alibi_slopes=slopes)

    cu_q, cu_k, max_q, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(cu, causal, rank,
                                                                             world)
    local = dc._leaves(*(cut(t) for t in (q, k, v)))
    torch.manual_seed(SEED)  # every rank draws the seed one process draws
    out, lse, _ = llama3_flash_attn_varlen_func(*local, cu_q, cu_k, max_q, max_k, stride,
                                                k_slice, **options, return_attn_probs=True)
    out.backward(cut(grad_out))
    got = [out, lse] + [t.grad for t in local]
    torch.manual_seed(SEED)
    singles, _ = dc.one_process_varlen(q, k, v, None, grad_out, lengths, **options)
    # One process's LSE, which dropout leaves unchanged: the LSE's truth (float32).
    single_lse = ipex_flash.flash_attn_varlen_func(
        q, k, v, cu, cu, longest, longest, **{**options, "dropout_p": 0.0},
        return_attn_probs=True)[1]
    keep = keep_mask((len(lengths), heads[0], longest, longest))
    wants = references(q, k, v, keep, grad_out, F32, causal, window, slopes, cu)
    return compare_slice(got, singles, single_lse, wants, rank, n)


# 70 tokens: the rank boundary (35) falls inside sequence 1, which rank 1 continues.
LENGTHS = [13, 29, 1, 27]


@pytest.mark.parametrize("causal,heads,stride,window,alibi", [
    (True, (4, 2), 1, (-1, -1), False),   # two head groups, the second at query head 2
    (False, (4, 2), 2, (-1, -1), False),  # keys past the rank's end for its last sequence
    (False, (8, 4), 2, (-1, -1), False),  # two groups of two K/V heads: query heads 0 and 4
    (True, (6, 3), 1, (9, 0), True),      # a window and ALiBi from the global diagonal
    (False, (4, 2), 1, (7, 5), True),     # the same without causal: keys past the queries
])
def test_two_ranks(world2, causal, heads, stride, window, alibi):
    dc.check_errors(world2.run(llama3_case, causal=causal, lengths=LENGTHS, heads=heads,
                               stride=stride, window=window, alibi=alibi), F32)


@pytest.mark.parametrize("causal,lengths,heads,stride", [
    # 84 tokens, 21 per rank: sequence 1 spans ranks 0 to 2, rank 3 begins inside sequence 2.
    (True, [3, 51, 17, 1, 12], (8, 2), 1),
    (False, [3, 51, 17, 1, 12], (4, 2), 2),
    # Empty sequences: rank 1 begins with one (global index 1) where rank 0 ended.
    (True, [8, 0, 20, 0, 4], (4, 2), 1),
])
def test_four_ranks(world4, causal, lengths, heads, stride):
    dc.check_errors(world4.run(llama3_case, causal=causal, lengths=lengths, heads=heads,
                               stride=stride), F32)


def _warm_counts(rank, world):
    """Collectives of a warm training call with dropout, and of a new batch's first call."""
    from helpers.collective_counts import CollectiveCounts

    torch.manual_seed(5)
    cu = dc.cu_seqlens([7, 13])
    q, k, v = (torch.randn(20, heads, 16)[rank * 10:(rank + 1) * 10].requires_grad_()
               for heads in (4, 2, 2))
    prepared = llama3_flash_attn_prepare_cu_seqlens(cu, True, rank, world)
    call = lambda args: llama3_flash_attn_varlen_func(  # noqa: E731
        q, k, v, *args[:4], 1, args[4], dropout_p=P, causal=True)
    call(prepared).sum().backward()
    with CollectiveCounts() as training:
        call(prepared).sum().backward()
    with CollectiveCounts() as new_batch, torch.no_grad():
        call(llama3_flash_attn_prepare_cu_seqlens(cu.clone(), True, rank, world))
    return dict(training.counts), dict(new_batch.counts)


def test_warm_calls_add_no_collective(world2):
    """What dropout needs of the other ranks rides on the agreement's one all_gather, made
    for a new batch's offsets only: warm calls gather K/V and scatter dK/dV, as without."""
    for training, new_batch in world2.run(_warm_counts):
        assert training == {"all_gather_single": 4, "reduce_scatter_single": 2}, training
        assert new_batch == {"all_gather_single": 2, "all_gather": 1}, new_batch
