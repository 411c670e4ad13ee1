"""llama3_flash_attn_varlen_func (all-gathered K/V over a packed token stream cut into equal
contiguous slices) at 2 and 4 ranks over gloo on the SYCL CPU device: forward and gradients
against one process's flash_attn_varlen_func and float64, with sequences that cross rank
boundaries, GQA over several heads_k_stride groups, causal windows, ALiBi, softcap and sinks;
llama3_flash_attn_prepare_cu_seqlens against the offsets worked out by hand."""
from helpers import distributed_cases as dc
from helpers.collective_counts import CollectiveCounts
import pytest
import torch
import torch.distributed as dist

from ipex_flash.distributed.llama3 import (
    llama3_flash_attn_prepare_cu_seqlens, llama3_flash_attn_varlen_func,
    llama3_flash_attn_varlen_kvpacked_func, llama3_flash_attn_varlen_qkvpacked_func)

F32, BF16 = torch.float32, torch.bfloat16
_cu = dc.cu_seqlens


def test_prepare_cu_seqlens_by_hand():
    """Sequences of 5, 9 and 2 tokens over 2 ranks of 8: rank 0 holds sequence 0 and the first
    3 tokens of sequence 1; rank 1 the other 6 of sequence 1 and sequence 2, whose keys start
    at sequence 1's first token (global 5)."""
    cu = _cu([5, 9, 2])
    cu_q, cu_k, max_q, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(cu, True, 0, 2)
    assert cu_q.tolist() == [0, 5, 8] and cu_k.tolist() == [0, 5, 8]
    assert (max_q, max_k, k_slice) == (5, 5, slice(0, 8))
    cu_q, cu_k, max_q, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(cu, True, 1, 2)
    assert cu_q.tolist() == [0, 6, 8] and cu_k.tolist() == [0, 9, 11]
    assert (max_q, max_k, k_slice) == (6, 9, slice(5, 16))
    # Without causal rank 0's keys run to the end of sequence 1.
    cu_q, cu_k, _, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(cu, False, 0, 2)
    assert cu_q.tolist() == [0, 5, 8] and cu_k.tolist() == [0, 5, 14]
    assert (max_k, k_slice) == (9, slice(0, 14))
    assert cu_q.dtype == torch.int32


@pytest.mark.parametrize("args,message", [
    ((_cu([5, 4]), True, 0, 2), "multiple of world_size"),
    ((_cu([4, 4]), True, 2, 2), "rank must be"),
    ((torch.tensor([0, 5, 3, 8]), True, 0, 2), "never decrease"),
])
def test_prepare_cu_seqlens_refuses(args, message):
    with pytest.raises(ValueError, match=message):
        llama3_flash_attn_prepare_cu_seqlens(*args)


def llama3_case(rank, world, dtype, causal, lengths, heads=(4, 2), stride=1, head_dim=32,
                window=(-1, -1), softcap=0.0, sinks=False, alibi=False, seed=0):
    """This rank's contiguous slice of the packed stream through llama3_flash_attn_varlen_func,
    against the whole batch in one process and in float64: distributed_cases' result dict."""
    total = sum(lengths)
    q, k, v, grad_out, sink = dc.draw((total,), heads, head_dim, dtype, sinks, seed)
    slopes = torch.rand(heads[0]) * 0.3 if alibi else None
    cu = _cu(lengths)
    per_rank = total // world
    cut = lambda t: t[rank * per_rank:(rank + 1) * per_rank]  # noqa: E731
    options = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes)

    cu_q, cu_k, max_q, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(cu, causal, rank,
                                                                             world)
    local = dc._leaves(*(cut(t) for t in (q, k, v)), sink)
    out, lse, _ = llama3_flash_attn_varlen_func(*local[:3], cu_q, cu_k, max_q, max_k, stride,
                                                k_slice, **options, return_attn_probs=True,
                                                sinks=local[3])
    out.backward(cut(grad_out))
    got = [out, lse] + [t.grad for t in local if t is not None]
    if sinks:
        dist.all_reduce(got[-1])
    singles, single_lse = dc.one_process_varlen(q, k, v, sink, grad_out, lengths,
                                                with_lse=True, **options)
    singles.insert(1, single_lse)
    wants = dc.references(q, k, v, sink, grad_out, dtype, causal, window, softcap, slopes, cu)
    for want in wants.values():
        # The LSE's truth is one process's float32 LSE (no float64 reference computes it).
        want.insert(1, single_lse)
    return dc.compare(got, singles, wants, dtype, cut, sinks, check_dtypes=True,
                      lse_cut=lambda t: t[:, rank * per_rank:][:, :per_rank])


# 70 tokens: rank boundaries (35) fall inside sequences; one of a single token.
LENGTHS = [13, 29, 1, 27]


@pytest.mark.parametrize("dtype,causal,stride", [
    (F32, True, 1),    # two K/V head groups, each gathered while the other is used
    (F32, False, 2),   # keys past the rank's end for its last sequence
    (BF16, True, 2),
])
def test_two_ranks(world2, dtype, causal, stride):
    dc.check_errors(world2.run(llama3_case, dtype=dtype, causal=causal, lengths=LENGTHS,
                               stride=stride), dtype)


def test_two_ranks_window_alibi_softcap_sinks(world2):
    """Every score option in global positions of each sequence, GQA 6/3, one group per K/V
    head."""
    dc.check_errors(world2.run(llama3_case, dtype=F32, causal=True, lengths=LENGTHS,
                               heads=(6, 3), window=(9, 0), softcap=5.0, sinks=True,
                               alibi=True), F32)


def _packed_forms(rank, world):
    """The qkv- and kv-packed forms give the unpacked function's output."""
    torch.manual_seed(2)
    cu = _cu([7, 13])
    qkv = torch.randn(20, 3, 2, 16)[rank * 10:(rank + 1) * 10]
    args = llama3_flash_attn_prepare_cu_seqlens(cu, True, rank, world)
    prepared = args[:4] + (1, args[4])
    want = llama3_flash_attn_varlen_func(*qkv.unbind(1), *prepared, causal=True)
    got_qkv = llama3_flash_attn_varlen_qkvpacked_func(qkv, *prepared, causal=True)
    got_kv = llama3_flash_attn_varlen_kvpacked_func(qkv[:, 0], qkv[:, 1:], *prepared,
                                                    causal=True)
    return torch.equal(got_qkv, want) and torch.equal(got_kv, want)


def test_packed_forms(world2):
    assert world2.run(_packed_forms) == [True, True]


def _refusals(rank, world):
    """Each bad argument's exception type and message, raised before any collective."""
    cu = _cu([8, 8])
    q = torch.randn(8, 4, 16)
    k = torch.randn(8, 2, 16)
    cu_q, cu_k, max_q, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(cu, True, rank,
                                                                             world)
    calls = {
        "dropout_p": dict(dropout_p=1.0),
        "heads_k_stride": dict(heads_k_stride=3),
        "local_k_slice": dict(local_k_slice=slice(0, 99)),
        # Slopes are per local sequence: the whole batch's (2, nheads) rows are not this
        # rank's one.
        "alibi_slopes": dict(causal=False, alibi_slopes=torch.ones(2, 4)),
    }
    seen = {}
    for name, change in calls.items():
        kwargs = {**dict(heads_k_stride=1, local_k_slice=k_slice, causal=True), **change}
        try:
            llama3_flash_attn_varlen_func(q, k, k, cu_q, cu_k, max_q, max_k, **kwargs)
        except (ValueError, NotImplementedError) as error:
            seen[name] = (type(error).__name__, name in str(error))
    return seen


def test_bad_arguments_refused(world2):
    for seen in world2.run(_refusals):
        assert seen == {"dropout_p": ("ValueError", True),
                        "heads_k_stride": ("ValueError", True),
                        "local_k_slice": ("ValueError", True),
                        "alibi_slopes": ("ValueError", True)}


def _warm_counts(rank, world):
    """Collectives of a call whose arguments and offsets were seen before, of its backward,
    and of a call with a new batch's offsets."""
    torch.manual_seed(5)
    cu = _cu([7, 13])
    q, k, v = (torch.randn(20, heads, 16)[rank * 10:(rank + 1) * 10].requires_grad_()
               for heads in (4, 2, 2))
    prepared = llama3_flash_attn_prepare_cu_seqlens(cu, True, rank, world)
    call = lambda args: llama3_flash_attn_varlen_func(  # noqa: E731
        q, k, v, *args[:4], 1, args[4], causal=True)
    call(prepared).sum().backward()
    with CollectiveCounts() as forward, torch.no_grad():
        call(prepared)
    with CollectiveCounts() as training:
        call(prepared).sum().backward()
    with CollectiveCounts() as new_batch, torch.no_grad():
        call(llama3_flash_attn_prepare_cu_seqlens(cu.clone(), True, rank, world))
    return dict(forward.counts), dict(training.counts), dict(new_batch.counts)


def test_warm_calls_only_gather_kv_and_scatter_grads(world2):
    """Two K/V heads gathered one at a time: 2 all-gathers forward; the backward gathers again
    and reduce-scatters dK/dV per head; the agreement's all_gather only for new offsets."""
    for forward, training, new_batch in world2.run(_warm_counts):
        assert forward == {"all_gather_single": 2}, forward
        assert training == {"all_gather_single": 4, "reduce_scatter_single": 2}, training
        assert new_batch == {"all_gather_single": 2, "all_gather": 1}, new_batch


def _compiled_equals_eager(rank, world):
    """inductor with fullgraph=True (a graph break raises) over a loss with two calls, the
    second on the first's output: forward, gradients of q, k, v and the sinks."""
    torch.manual_seed(7)
    cu = _cu([9, 26, 5])
    whole = [torch.randn(40, heads, 16) for heads in (4, 2, 2)]
    sinks = torch.randn(4)
    prepared = llama3_flash_attn_prepare_cu_seqlens(cu, True, rank, world)
    args = (*prepared[:4], 1, prepared[4])

    def loss(q, k, v, sinks):
        out = llama3_flash_attn_varlen_func(q, k, v, *args, causal=True, window_size=(11, 0),
                                            softcap=4.0, sinks=sinks)
        out = llama3_flash_attn_varlen_func(out * 0.5, k, v, *args, causal=True, sinks=sinks)
        return (out ** 2).sum()

    results = []
    for fn in (loss, torch.compile(loss, backend="inductor", fullgraph=True)):
        leaves = [t[rank * 20:(rank + 1) * 20].clone().requires_grad_() for t in whole]
        leaves.append(sinks.clone().requires_grad_())
        value = fn(*leaves)
        value.backward()
        results.append([value.detach()] + [t.grad for t in leaves])
    return [(dc.max_error(c, e), e.abs().max().item()) for e, c in zip(*results)]


def test_compiled_equals_eager(world2):
    for errors in world2.run(_compiled_equals_eager):
        for error, size in errors:
            assert error <= 1e-5 * max(1.0, size), errors


def test_four_ranks():
    """Sequences spanning three ranks, MQA-like 8/2 with stride 1, fp32 causal with a window
    and sinks, and bf16 without causal, in one world."""
    world = dc.World(4)
    try:
        lengths = [3, 51, 17, 1, 12]  # 84 tokens, 21 per rank
        dc.check_errors(world.run(llama3_case, dtype=F32, causal=True, lengths=lengths,
                                  heads=(8, 2), window=(20, 0), sinks=True), F32)
        dc.check_errors(world.run(llama3_case, dtype=BF16, causal=False, lengths=lengths,
                                  heads=(8, 2), stride=2), BF16)
    finally:
        world.close()
