"""ring_flash_attn_varlen_func at 2 and 4 ranks over gloo on the SYCL CPU device: packed
sequences of different lengths, each split evenly across the ranks (varlen_shard), forward
and gradients against one process's flash_attn_varlen_func and float64; rows padded past
cu_seqlens[-1] (NaN) left out of every result; windows in global positions."""
from helpers import distributed_cases as dc
import pytest
import torch
import torch.distributed as dist

from ipex_flash import distributed as ifd

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def varlen_case(rank, world, dtype, causal, lengths, heads=(4, 2), head_dim=32, softcap=0.0,
                sinks=False, pad=0, seed=0, window=(-1, -1)):
    """pad: NaN rows after each rank's shard and after the one process's whole batch."""
    q, k, v, grad_out, sink = dc.draw((sum(lengths),), heads, head_dim, dtype, sinks, seed)
    cu = dc.cu_seqlens(lengths)
    cut = lambda t: ifd.varlen_shard(t, cu, rank, world)[0]  # noqa: E731
    _, cu_local, longest = ifd.varlen_shard(q, cu, rank, world)

    local_rows = int(cu_local[-1])
    local = dc._leaves(*(dc.padded(cut(t), pad) for t in (q, k, v)), sink)
    out = ifd.ring_flash_attn_varlen_func(*local[:3], cu_local, longest, causal=causal,
                                          window_size=window, softcap=softcap, sinks=local[3])
    out.backward(dc.padded(cut(grad_out), pad))
    got = [out] + [t.grad for t in local if t is not None]
    for name, t in zip(["out", "dq", "dk", "dv"], got):
        dc.check_padding(name, t[local_rows:])
    got[:4] = [t[:local_rows] for t in got[:4]]
    if sinks:
        dist.all_reduce(got[-1])
    singles, _ = dc.one_process_varlen(q, k, v, sink, grad_out, lengths, pad * world,
                                       causal=causal, window_size=window, softcap=softcap)
    wants = dc.references(q, k, v, sink, grad_out, dtype, causal, window, softcap=softcap,
                          cu=cu)
    return dc.compare(got, singles, wants, dtype, cut, sinks)


@pytest.mark.parametrize("dtype,causal", [(F32, False), (F32, True), (BF16, True)])
def test_two_ranks(world2, dtype, causal):
    dc.check_errors(world2.run(varlen_case, dtype=dtype, causal=causal, lengths=[16, 42, 6]),
                    dtype)


def test_softcap_and_sinks(world2):
    dc.check_errors(world2.run(varlen_case, dtype=F32, causal=True, lengths=[24, 10],
                               softcap=6.0, sinks=True), F32)


@pytest.mark.parametrize("causal,sinks", [(False, False), (True, True)])
def test_padding_past_the_sequences(world2, causal, sinks):
    """Packed rows past cu_seqlens[-1] belong to no sequence (one process's
    flash_attn_varlen_func ignores them too): the real rows and the sinks' gradient are the
    unpadded batch's, and the pad rows' output and gradients are zero although the pad is
    NaN."""
    dc.check_errors(world2.run(varlen_case, dtype=F32, causal=causal, lengths=[16, 42, 6],
                               sinks=sinks, pad=5), F32)


def _padding_lse(rank, world):
    """The LSE of pad rows: -inf, or the sink's logit, the only term of their denominator."""
    torch.manual_seed(3)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    q = dc.padded(torch.randn(10, 2, 16), 3)
    sink = torch.randn(2)
    lse = ifd.ring_flash_attn_varlen_func(q, q, q, cu, 6, return_attn_probs=True)[1]
    sink_lse = ifd.ring_flash_attn_varlen_func(q, q, q, cu, 6, sinks=sink,
                                               return_attn_probs=True)[1]
    return (bool(torch.isneginf(lse[:, 10:]).all()) and bool(lse[:, :10].isfinite().all())
            and torch.allclose(sink_lse[:, 10:], sink[:, None].expand(2, 3)))


def test_padding_lse(world2):
    assert world2.run(_padding_lse) == [True, True]


def _packed_forms(rank, world):
    """The qkv- and kv-packed forms give the unpacked function's output."""
    torch.manual_seed(2)
    cu = torch.tensor([0, 8, 20], dtype=torch.int32)
    qkv = torch.randn(20, 3, 2, 16)
    local, cu_local, longest = ifd.varlen_shard(qkv, cu, rank, world)
    q, k, v = local.unbind(1)
    want = ifd.ring_flash_attn_varlen_func(q, k, v, cu_local, longest, causal=True)
    got_qkv = ifd.ring_flash_attn_varlen_qkvpacked_func(local, cu_local, longest, causal=True)
    got_kv = ifd.ring_flash_attn_varlen_kvpacked_func(q, local[:, 1:], cu_local, longest,
                                                      causal=True)
    return torch.equal(got_qkv, want) and torch.equal(got_kv, want)


def test_packed_forms(world2):
    assert world2.run(_packed_forms) == [True, True]


@pytest.mark.parametrize("causal,window", [(True, (5, -1)), (False, (9, 3))])
def test_windows(world2, causal, window):
    """Windows in each sequence's global positions: every call is placed at its sequences'
    offsets, which differ from sequence to sequence; with 16, 42 and 6 tokens, some
    sequences' slices see nothing of another rank's."""
    dc.check_errors(world2.run(varlen_case, dtype=F32, causal=causal, lengths=[16, 42, 6],
                               window=window), F32)


def _different_offsets(rank, world):
    q = torch.randn(8, 2, 16)
    cu = torch.tensor([0, 3 + rank, 8], dtype=torch.int32)
    ifd.ring_flash_attn_varlen_func(q, q, q, cu, 8)


def test_different_offsets_refused_on_every_rank(world2):
    for ok, (kind, message, _) in world2.run_raw(_different_offsets):
        assert not ok and kind == "ValueError" and "cu_seqlens[1] differs" in message


@pytest.mark.full
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("causal", [False, True])
def test_four_ranks(dtype, causal):
    world = dc.World(4)
    try:
        dc.check_errors(world.run(varlen_case, dtype=dtype, causal=causal,
                                  lengths=[8, 52, 4, 32], heads=(4, 1)), dtype)
    finally:
        world.close()
