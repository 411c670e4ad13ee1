"""zigzag_ring_flash_attn_varlen_func at 2 and 4 ranks over gloo on the SYCL CPU device: packed
sequences of different lengths, each zigzag-sharded (zigzag_varlen_shard), forward, LSE and
gradients against one process's flash_attn_varlen_func and float64, causal or not, GQA,
softcap, sinks, bfloat16; rows padded past cu_seqlens[-1] with NaN left out of every result;
windows in global positions; the shard helper against the layout by hand; odd local lengths
refused."""
from helpers import distributed_cases as dc
import pytest
import torch
import torch.distributed as dist

from ipex_flash import distributed as ifd

F32, BF16 = torch.float32, torch.bfloat16


def zigzag_varlen_case(rank, world, dtype, causal, lengths, heads=(4, 2), head_dim=32,
                       softcap=0.0, sinks=False, pad=0, seed=0, window=(-1, -1)):
    """{name: (error vs float64, vs one process, torch's error in dtype, size)} for out, lse,
    dq, dk, dv (and the sinks' gradient summed over the group); pad: NaN rows after this
    rank's shard and after the one process's batch, whose results must stay zero."""
    total = sum(lengths)
    q, k, v, grad_out, sink = dc.draw((total,), heads, head_dim, dtype, sinks, seed)
    cu = dc.cu_seqlens(lengths)
    cut = lambda t: ifd.zigzag_varlen_shard(t, cu, rank, world)[0]  # noqa: E731
    _, cu_local, longest = ifd.zigzag_varlen_shard(q, cu, rank, world)
    rows = int(cu_local[-1])

    local = dc._leaves(*(dc.padded(cut(t), pad) for t in (q, k, v)), sink)
    out, lse, _ = ifd.zigzag_ring_flash_attn_varlen_func(
        *local[:3], cu_local, longest, causal=causal, window_size=window, softcap=softcap,
        sinks=local[3], return_attn_probs=True)
    out.backward(dc.padded(cut(grad_out), pad))
    got = [out, lse] + [t.grad for t in local if t is not None]
    for name, t in zip(["out", "lse", "dq", "dk", "dv"], got):
        padding = t[:, rows:] if name == "lse" else t[rows:]
        if name == "lse" and sink is not None:
            assert torch.allclose(padding, sink[:, None].expand_as(padding)), name
        else:
            dc.check_padding(name, padding, float("-inf") if name == "lse" else 0.0)
    got = [got[0][:rows], got[1][:, :rows]] + [t[:rows] for t in got[2:5]] + got[5:]
    if sinks:
        dist.all_reduce(got[-1])

    singles, single_lse = dc.one_process_varlen(q, k, v, sink, grad_out, lengths, pad * world,
                                                with_lse=True, causal=causal,
                                                window_size=window, softcap=softcap)
    singles.insert(1, single_lse)
    wants = dc.references(q, k, v, sink, grad_out, dtype, causal, window, softcap=softcap,
                          cu=cu)
    for want in wants.values():
        # The LSE has no float64 reference here: one process's float32 LSE stands in.
        want.insert(1, single_lse.double())
    return dc.compare(got, singles, wants, dtype, cut, sinks, lse_cut=lambda t: cut(t.T).T)


# Lengths multiples of 2P = 4, none of the kernels' tile sizes.
@pytest.mark.parametrize("dtype,causal,pad", [(F32, True, 5), (F32, False, 0), (BF16, True, 0)])
def test_two_ranks(world2, dtype, causal, pad):
    dc.check_errors(world2.run(zigzag_varlen_case, dtype=dtype, causal=causal,
                               lengths=[12, 44, 4, 20], pad=pad), dtype)


def test_gqa_softcap_sinks_and_padding(world2):
    dc.check_errors(world2.run(zigzag_varlen_case, dtype=F32, causal=True, lengths=[28, 8],
                               heads=(4, 1), softcap=6.0, sinks=True, pad=3), F32)


@pytest.mark.parametrize("causal,window", [(True, (6, -1)), (False, (3, 10))])
def test_windows(world2, causal, window):
    dc.check_errors(world2.run(zigzag_varlen_case, dtype=F32, causal=causal,
                               lengths=[12, 44, 4, 20], window=window), F32)


def _forms_and_refusals(rank, world):
    """The packed forms give the unpacked function's output; odd local lengths raise, naming
    what is wrong."""
    torch.manual_seed(2)
    cu = torch.tensor([0, 8, 20], dtype=torch.int32)
    local, cu_local, longest = ifd.zigzag_varlen_shard(torch.randn(20, 3, 2, 16), cu, rank,
                                                       world)
    q, k, v = local.unbind(1)
    want = ifd.zigzag_ring_flash_attn_varlen_func(q, k, v, cu_local, longest, causal=True)
    same = (torch.equal(ifd.zigzag_ring_flash_attn_varlen_qkvpacked_func(
                local, cu_local, longest, causal=True), want)
            and torch.equal(ifd.zigzag_ring_flash_attn_varlen_kvpacked_func(
                q, local[:, 1:], cu_local, longest, causal=True), want))
    errors = []
    for kwargs in ({"cu": torch.tensor([0, 3, 9], dtype=torch.int32)},):
        cu_arg = kwargs.pop("cu", cu_local)
        try:
            ifd.zigzag_ring_flash_attn_varlen_func(q, k, v, cu_arg, longest, causal=True,
                                                   **kwargs)
        except (ValueError, NotImplementedError) as error:
            errors.append(f"{type(error).__name__}: {error}")
    return same, errors


def test_packed_forms_and_refusals(world2):
    for same, errors in world2.run(_forms_and_refusals):
        assert same
        assert len(errors) == 1
        assert errors[0].startswith("ValueError") and "even" in errors[0]


def test_shard_is_the_layout_by_hand():
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)
    x = torch.arange(12)
    # Sequence 0 in chunks [0 1][2 3][4 5][6 7], sequence 1 in [8][9][10][11].
    assert ifd.zigzag_varlen_shard(x, cu, 0, 2)[0].tolist() == [0, 1, 6, 7, 8, 11]
    shard, cu_local, longest = ifd.zigzag_varlen_shard(x, cu, 1, 2)
    assert shard.tolist() == [2, 3, 4, 5, 9, 10]
    assert cu_local.tolist() == [0, 4, 6] and longest == 4
    y = torch.randn(24, 2)
    cu = torch.tensor([0, 8, 24], dtype=torch.int32)
    assert torch.equal(ifd.zigzag_varlen_unshard(
        [ifd.zigzag_varlen_shard(y, cu, r, 4)[0] for r in range(4)], cu), y)
    with pytest.raises(ValueError, match="multiple of 2 \\* world_size"):
        ifd.zigzag_varlen_shard(y, cu, 0, 3)


def test_four_ranks():
    world = dc.World(4)
    try:
        dc.check_errors(world.run(zigzag_varlen_case, dtype=F32, causal=True,
                                  lengths=[8, 56, 24], heads=(4, 1), pad=2), F32)
        dc.check_errors(world.run(zigzag_varlen_case, dtype=BF16, causal=True,
                                  lengths=[40, 16]), BF16)
    finally:
        world.close()
