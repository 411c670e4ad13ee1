"""Dropout with Ulysses and USP, at 2 and 4 gloo ranks on the SYCL CPU device. After the
all-to-all a rank computes a slice of the heads, and its kernel calls are placed at their
first query head among all of them, so a sharded call keeps exactly the probabilities one
process's flash_attn_func keeps for the same seed: every rank's output and gradients are
checked against float64 attention with that keep-mask and against that call itself. A call
drawn at its own heads (from head 0) keeps another mask on every rank but the first."""
from dropout_cases import P, SEED, keep_mask, references
from helpers import distributed_cases as dc
import pytest
import torch
import torch.distributed as dist

import ipex_flash
from ipex_flash import distributed as ifd
from ipex_flash.distributed.usp import usp_flash_attn_func, usp_groups_from_mesh, usp_shard

F32 = torch.float32


def _single_lse(q, k, v, **options):
    """One process's LSE (batch, heads, seqlen): dropout leaves it unchanged."""
    options = {**options, "dropout_p": 0.0}
    return ipex_flash.flash_attn_func(q, k, v, **options, return_attn_probs=True)[1]


def _case(q, k, v, grad_out, call, cut, lse_cut, causal, window, slopes):
    """This rank's out, lse, dq, dk, dv through call(q, k, v, **options) on its shards,
    against one process's flash_attn_func and float64 with its keep-mask."""
    options = dict(dropout_p=P, causal=causal, window_size=window, alibi_slopes=slopes)
    local = dc._leaves(*(cut(t) for t in (q, k, v)))
    torch.manual_seed(SEED)  # every rank draws the seed one process draws
    out, lse, probs = call(*local, **options, return_attn_probs=True)
    assert probs is None
    out.backward(cut(grad_out))
    got = [out, lse] + [t.grad for t in local]
    torch.manual_seed(SEED)
    singles = dc.one_process(q, k, v, None, grad_out, **options)
    single_lse = _single_lse(q, k, v, **options)
    singles.insert(1, single_lse)
    keep = keep_mask((q.shape[0], q.shape[2], q.shape[1], q.shape[1]))
    wants = references(q, k, v, keep, grad_out, F32, causal, window, slopes)
    for want in wants.values():
        want.insert(1, single_lse)  # the LSE's truth: one process's (float32)
    return dc.compare(got, singles, wants, F32, cut, False, lse_cut, check_dtypes=True)


def ulysses_case(rank, world, causal, heads, window=(-1, -1), alibi=False, lengths=None,
                 seqlen=64):
    """Contiguous shards (of the given lengths) through ulysses_flash_attn_func."""
    q, k, v, grad_out, _ = dc.draw((2, seqlen), heads, 32, F32)
    slopes = torch.rand(2, heads[0]) * 0.3 if alibi else None  # per sequence and head

    def part(t, dim):
        sizes = lengths or [seqlen // world] * world
        return t.split(sizes, dim=dim)[rank]
    return _case(q, k, v, grad_out, ifd.ulysses_flash_attn_func, lambda t: part(t, 1),
                 lambda t: part(t, 2), causal, window, slopes)


@pytest.mark.parametrize("causal,heads,window,alibi,lengths", [
    (False, (4, 2), (-1, -1), False, None),
    (True, (4, 2), (-1, -1), True, [37, 27]),   # uneven shards
    (True, (4, 1), (13, -1), False, None),      # MQA: the K/V head sent twice
    (False, (6, 3), (9, 4), False, [30, 34]),   # three K/V heads, six copies
])
def test_ulysses_two_ranks(world2, causal, heads, window, alibi, lengths):
    dc.check_errors(world2.run(ulysses_case, causal=causal, heads=heads, window=window,
                               alibi=alibi, lengths=lengths), F32)


@pytest.mark.parametrize("causal,heads", [(True, (8, 2)), (False, (4, 1))])
def test_ulysses_four_ranks(world4, causal, heads):
    """K/V heads replicated (two and four copies): each rank's query heads still draw at
    their own global indices."""
    dc.check_errors(world4.run(ulysses_case, causal=causal, heads=heads, seqlen=48), F32)


_GROUPS = {}  # this rank process's 2 x 2 mesh groups, made once


def usp_case(rank, world, ring_impl, causal, heads, window=(-1, -1), alibi=False, seqlen=72):
    """usp_shard of each rank through usp_flash_attn_func over a 2 x 2 mesh."""
    if "groups" not in _GROUPS:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ring", "ulysses"))
        _GROUPS["groups"] = usp_groups_from_mesh(mesh)
    ulysses, ring = _GROUPS["groups"]
    ranks = (dist.get_rank(ulysses), 2, dist.get_rank(ring), 2)
    q, k, v, grad_out, _ = dc.draw((2, seqlen), heads, 32, F32)
    slopes = torch.rand(heads[0]) * 0.3 if alibi else None

    def call(*args, **options):
        return usp_flash_attn_func(*args, **options, ulysses_group=ulysses, ring_group=ring,
                                   ring_impl_type=ring_impl)
    return _case(q, k, v, grad_out, call, lambda t: usp_shard(t, *ranks, ring_impl),
                 lambda t: usp_shard(t, *ranks, ring_impl, dim=2), causal, window, slopes)


@pytest.mark.parametrize("ring_impl,causal,heads,window,alibi", [
    ("basic", False, (4, 2), (-1, -1), False),
    ("basic", True, (4, 1), (-1, -1), True),     # MQA replicated to both Ulysses ranks
    ("zigzag", True, (4, 2), (-1, -1), False),
    ("zigzag", True, (8, 2), (21, -1), False),   # a window in global positions
])
def test_usp_two_by_two(world4, ring_impl, causal, heads, window, alibi):
    dc.check_errors(world4.run(usp_case, ring_impl=ring_impl, causal=causal, heads=heads,
                               window=window, alibi=alibi), F32)


def _warm_counts(rank, world):
    """Collectives of a warm Ulysses training call with dropout."""
    from helpers.collective_counts import CollectiveCounts

    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 10, 4, 16, requires_grad=True) for _ in range(3))
    call = lambda: ifd.ulysses_flash_attn_func(q, k, v, dropout_p=P, causal=True)  # noqa: E731
    call().sum().backward()
    with CollectiveCounts() as training:
        call().sum().backward()
    return dict(training.counts)


def test_ulysses_warm_calls_move_only_data(world2):
    """The all-to-alls of q, k, v and out and of their gradients, as without dropout."""
    assert world2.run(_warm_counts) == [{"all_to_all_single": 8}] * 2
