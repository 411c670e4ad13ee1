"""Hybrid Ulysses + ring attention (usp.py) on 4 gloo ranks as 2 x 2 (a DeviceMesh with
dimensions "ring" and "ulysses") on the SYCL CPU device: forward and gradients against one
process's flash_attn_func and float64, with the basic and zigzag rings, K/V heads fewer than
the Ulysses group (replicated), GQA, windows, softcap, sinks, bf16 and uneven shards; the
yunchang-shaped LongContextAttention module, built from the mesh or from
set_seq_parallel_pg, gives the function's output; Ulysses alone replicates K/V heads at 4."""
from helpers import distributed_cases as dc
from helpers.collective_counts import CollectiveCounts
import pytest
import torch
import torch.distributed as dist

import ipex_flash
from ipex_flash.distributed.usp import (
    LongContextAttention, set_seq_parallel_pg, usp_flash_attn_func, usp_groups_from_mesh,
    usp_shard)

F32, BF16 = torch.float32, torch.bfloat16
_GROUPS = {}  # this rank process's groups, made once (every rank makes them in one order)


def _mesh_groups():
    if "mesh" not in _GROUPS:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ring", "ulysses"))
        _GROUPS["mesh"] = mesh
        _GROUPS["groups"] = usp_groups_from_mesh(mesh)
    return _GROUPS["groups"]


def usp_case(rank, world, ring_impl, dtype, causal, heads, window=(-1, -1), softcap=0.0,
             sinks=False, seqlen=72, batch=2, head_dim=32, seed=0, alibi=False):
    """This rank's usp_shard through usp_flash_attn_func against the whole batch in one
    process and in float64: distributed_cases' result dict."""
    ulysses, ring = _mesh_groups()
    ranks = (dist.get_rank(ulysses), dist.get_world_size(ulysses), dist.get_rank(ring),
             dist.get_world_size(ring))
    q, k, v, grad_out, sink = dc.draw((batch, seqlen), heads, head_dim, dtype, sinks, seed)
    slopes = torch.rand(batch, heads[0]) * 0.3 if alibi else None
    options = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
    cut = lambda t: usp_shard(t, *ranks, ring_impl)  # noqa: E731

    local = dc._leaves(*(cut(t) for t in (q, k, v)), sink)
    out = usp_flash_attn_func(*local[:3], **options, ulysses_group=ulysses, ring_group=ring,
                              ring_impl_type=ring_impl, sinks=local[3])
    out.backward(cut(grad_out))
    got = [out] + [t.grad for t in local if t is not None]
    if sinks:  # each rank's part, over both groups
        dist.all_reduce(got[-1])
    singles = dc.one_process(q, k, v, sink, grad_out, **options)
    wants = dc.references(q, k, v, sink, grad_out, dtype, causal, window, softcap, slopes)
    return dc.compare(got, singles, wants, dtype, cut, sinks)


@pytest.mark.parametrize("ring_impl,dtype,causal,heads,window,softcap,sinks,seqlen", [
    # MQA: the one K/V head is replicated to both Ulysses ranks; a window in global positions.
    ("basic", F32, True, (4, 1), (13, 0), 3.0, True, 70),   # Ulysses shards of 18 and 17
    ("zigzag", F32, True, (4, 2), (-1, -1), 0.0, False, 72),
    ("zigzag", BF16, True, (4, 1), (-1, -1), 0.0, True, 72),
    ("basic", F32, False, (8, 2), (-1, -1), 0.0, False, 64),
])
def test_two_by_two(world4, ring_impl, dtype, causal, heads, window, softcap, sinks, seqlen):
    dc.check_errors(world4.run(usp_case, ring_impl=ring_impl, dtype=dtype, causal=causal,
                               heads=heads, window=window, softcap=softcap, sinks=sinks,
                               seqlen=seqlen), dtype)


def test_two_by_two_alibi(world4):
    """(batch, nheads) slopes: each Ulysses rank's heads take theirs, and the ring measures
    the distances in global positions."""
    dc.check_errors(world4.run(usp_case, ring_impl="zigzag", dtype=F32, causal=True,
                               heads=(4, 2), alibi=True), F32)


def _module_forms(rank, world):
    """LongContextAttention from the mesh, and from set_seq_parallel_pg's groups (the same
    layout: Ulysses on consecutive ranks), give usp_flash_attn_func's output; its LSE is one
    process's for the rank's rows."""
    ulysses, ring = _mesh_groups()
    if "yunchang" not in _GROUPS:
        set_seq_parallel_pg(2, 2, rank, world)
        _GROUPS["yunchang"] = True
    ranks = (dist.get_rank(ulysses), 2, dist.get_rank(ring), 2)
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 40, 4, 16) for _ in range(3))
    local = [usp_shard(t, *ranks, "zigzag") for t in (q, k, v)]
    want, lse, _ = usp_flash_attn_func(*local, causal=True, return_attn_probs=True,
                                       ulysses_group=ulysses, ring_group=ring,
                                       ring_impl_type="zigzag")
    from_mesh = LongContextAttention(ring_impl_type="zigzag", mesh=_GROUPS["mesh"])(
        *local, causal=True)
    from_pg = LongContextAttention(ring_impl_type="zigzag")(*local, causal=True)
    _, single_lse, _ = ipex_flash.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    single_lse = usp_shard(single_lse, *ranks, "zigzag", dim=2)
    return (torch.equal(from_mesh, want) and torch.equal(from_pg, want)
            and dc.max_error(lse, single_lse) < 1e-5)


def test_module_forms(world4):
    assert world4.run(_module_forms) == [True] * 4


@pytest.mark.parametrize("heads", [(4, 1), (12, 3)])
def test_ulysses_alone_replicates_kv_heads(world4, heads):
    """Ulysses over all 4 ranks: MQA (4 copies), 3 K/V heads (12 copies, one per query head)."""
    dc.check_errors(world4.run(dc.fixed_length_case, api="ulysses", dtype=F32, causal=True,
                               heads=heads, seqlen=50, batch=1), F32)


def _warm_counts(rank, world):
    """Collectives of warm calls (arguments seen before): USP over the 2 x 2 mesh and Ulysses
    over all 4 ranks, forward alone and with the backward."""
    from ipex_flash.distributed.ulysses import ulysses_flash_attn_func

    ulysses, ring = _mesh_groups()
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 10, 4, 16, requires_grad=True) for _ in range(3))
    calls = {"usp": lambda: usp_flash_attn_func(q, k, v, causal=True, ulysses_group=ulysses,
                                                ring_group=ring, ring_impl_type="zigzag"),
             "ulysses": lambda: ulysses_flash_attn_func(q, k, v, causal=True)}
    counts = {}
    for name, call in calls.items():
        call().sum().backward()
        with CollectiveCounts() as forward, torch.no_grad():
            call()
        with CollectiveCounts() as training:
            call().sum().backward()
        counts[name] = (dict(forward.counts), dict(training.counts))
    return counts


def test_warm_calls_move_only_data(world4):
    """Ulysses: the all-to-alls of q, k, v and out (and of their gradients); USP adds the
    ring's point-to-point exchanges and nothing else: no all_gather once warm."""
    for counts in world4.run(_warm_counts):
        assert counts["ulysses"] == ({"all_to_all_single": 4}, {"all_to_all_single": 8})
        forward, training = counts["usp"]
        assert forward.pop("all_to_all_single") == 4 and training.pop("all_to_all_single") == 8
        assert set(forward) | set(training) <= {"batch_isend_irecv"}, (forward, training)


def _compiled_equals_eager(rank, world):
    """torch.compile with fullgraph=True (a graph break raises) over USP (zigzag ring, MQA,
    sinks): forward and gradients of q, k, v and the sinks."""
    ulysses, ring = _mesh_groups()
    ranks = (dist.get_rank(ulysses), 2, dist.get_rank(ring), 2)
    torch.manual_seed(8)
    whole = [torch.randn(1, 32, heads, 16) for heads in (4, 1, 1)]
    sinks = torch.randn(4)

    def loss(q, k, v, sinks):
        out = usp_flash_attn_func(q, k, v, causal=True, softcap=4.0, sinks=sinks,
                                  ulysses_group=ulysses, ring_group=ring,
                                  ring_impl_type="zigzag")
        return (out ** 2).sum()

    results = []
    # aot_eager: the whole graph through AOT autograd, without inductor's code generation
    # (which costs 4 ranks half a minute on two cores; llama3's test runs inductor).
    # Compiled first: the ranks' agreement is learned while tracing.
    for fn in (torch.compile(loss, backend="aot_eager", fullgraph=True), loss):
        leaves = [usp_shard(t, *ranks, "zigzag").requires_grad_() for t in whole]
        leaves.append(sinks.clone().requires_grad_())
        value = fn(*leaves)
        value.backward()
        results.append([value.detach()] + [t.grad for t in leaves])
    return [(dc.max_error(c, e), e.abs().max().item()) for c, e in zip(*results)]


def test_compiled_equals_eager(world4):
    for errors in world4.run(_compiled_equals_eager):
        for error, size in errors:
            assert error <= 1e-5 * max(1.0, size), errors


def _refusals(rank, world):
    ulysses, ring = _mesh_groups()
    q = torch.randn(1, 8, 3, 16)
    seen = {}
    for name, call in {
        "nheads": lambda: usp_flash_attn_func(q, q, q, ulysses_group=ulysses, ring_group=ring),
        "dropout_p": lambda: usp_flash_attn_func(
            q[:, :, :2], q[:, :, :2], q[:, :, :2], dropout_p=1.0, ulysses_group=ulysses,
            ring_group=ring),
        "ring_impl_type": lambda: LongContextAttention(ring_impl_type="stripes", mesh=None,
                                                       ulysses_group=ulysses),
    }.items():
        try:
            call()
        except (ValueError, NotImplementedError) as error:
            seen[name] = name in str(error)
    return seen


def test_bad_arguments_refused(world4):
    assert world4.run(_refusals) == [{"nheads": True, "dropout_p": True,
                                      "ring_impl_type": True}] * 4
