"""Ulysses (all-to-all between heads and sequence) at 2 and 4 ranks over gloo on the SYCL CPU
device: forward and gradients against one process and float64 (distributed_cases), with
GQA, causal masks, windows, ALiBi, softcap, sinks, 16-bit dtypes and uneven shards; K/V heads
the group size does not divide are replicated, query heads it does not divide refused."""
from helpers import distributed_cases as dc
import pytest
import torch

from ipex_flash import distributed as ifd

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


@pytest.mark.parametrize("dtype,causal,window,alibi", [
    (F32, False, (-1, -1), False),
    (F32, True, (-1, -1), True),
    (F32, True, (11, -1), False),
    (BF16, True, (-1, -1), False),
    (F16, False, (6, 6), True),
])
def test_two_ranks(world2, dtype, causal, window, alibi):
    dc.check_errors(world2.run(dc.fixed_length_case, api="ulysses", dtype=dtype, causal=causal,
                               window=window, alibi=alibi), dtype)


def test_softcap_sinks_and_uneven_shards(world2):
    dc.check_errors(world2.run(dc.fixed_length_case, api="ulysses", dtype=F32, causal=True,
                               softcap=4.0, sinks=True, lengths=[37, 27]), F32)


def _returns_lse(rank, world):
    """return_attn_probs gives (out, lse of this rank's rows, None), lse as one process's."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 32, 4, 16) for _ in range(3))
    _, lse, probs = ifd.ulysses_flash_attn_func(
        *(ifd.contiguous_shard(t, rank, world) for t in (q, k, v)), causal=True,
        return_attn_probs=True)
    _, want, _ = ifd.ring_flash_attn_func(
        *(ifd.contiguous_shard(t, rank, world) for t in (q, k, v)), causal=True,
        return_attn_probs=True)
    return probs is None and lse.shape == (1, 4, 16) and dc.max_error(lse, want) < 1e-5


def test_lse_matches_the_ring(world2):
    assert world2.run(_returns_lse) == [True, True]


def _indivisible_heads(rank, world, heads):
    q = torch.randn(1, 8, heads[0], 16)
    k = v = torch.randn(1, 8, heads[1], 16)
    ifd.ulysses_flash_attn_func(q, k, v)


def test_indivisible_heads_refused(world2):
    for ok, (kind, message, _) in world2.run_raw(_indivisible_heads, heads=(3, 3)):
        assert not ok and kind == "ValueError" and "nheads" in message and "multiple" in message


@pytest.mark.parametrize("heads", [(4, 1), (6, 3)])
def test_fewer_kv_heads_than_ranks_replicated(world2, heads):
    """MQA (one K/V head, two copies) and 3 K/V heads over 2 ranks (six copies, one per
    query head): forward and the gradients summed over the copies."""
    dc.check_errors(world2.run(dc.fixed_length_case, api="ulysses", dtype=F32, causal=True,
                               heads=heads, sinks=True), F32)


@pytest.mark.full
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("causal", [False, True])
def test_four_ranks(dtype, causal):
    world = dc.World(4)
    try:
        dc.check_errors(world.run(dc.fixed_length_case, api="ulysses", dtype=dtype,
                                  causal=causal, heads=(8, 4), window=(17, -1), seqlen=96,
                                  alibi=True), dtype)
    finally:
        world.close()
