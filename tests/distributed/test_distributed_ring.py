"""Ring and zigzag ring attention (ipex_flash.distributed) at 2 and 4 ranks over gloo on the
SYCL CPU device: forward and gradients of every rank's shard against the whole batch run in
one process by ipex_flash.flash_attn_func and against float64 (distributed_cases.check_errors
has the pass rule), causal or not, with GQA, windows, softcap, sinks, 16-bit dtypes, and
shards of unequal length."""
from helpers import distributed_cases as dc
import pytest
import torch

import ipex_flash
from ipex_flash import distributed as ifd


F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
CASES_2 = [  # (kind, dtype, causal, window)
    ("ring", F32, False, (-1, -1)),
    ("ring", F32, True, (-1, -1)),
    ("zigzag", F32, True, (-1, -1)),
    ("zigzag", F32, False, (-1, -1)),
    ("zigzag", F32, True, (20, -1)),
    ("ring", F32, False, (7, 11)),
    ("zigzag", BF16, True, (-1, -1)),
    ("ring", F16, False, (-1, -1)),
]


@pytest.mark.parametrize("kind,dtype,causal,window", CASES_2)
def test_two_ranks(world2, kind, dtype, causal, window):
    dc.check_errors(world2.run(dc.fixed_length_case, api=kind, dtype=dtype, causal=causal,
                               window=window), dtype)


@pytest.mark.parametrize("kind,dtype,causal,window", [
    ("zigzag", F32, True, (-1, -1)),
    ("ring", F32, True, (-1, -1)),
    ("zigzag", F32, True, (13, -1)),
    ("ring", BF16, False, (-1, -1)),
])
def test_four_ranks(world4, kind, dtype, causal, window):
    dc.check_errors(world4.run(dc.fixed_length_case, api=kind, dtype=dtype, causal=causal,
                               window=window, seqlen=128), dtype)


@pytest.mark.parametrize("kind", ["ring", "zigzag"])
def test_softcap_and_sinks(world2, kind):
    dc.check_errors(world2.run(dc.fixed_length_case, api=kind, dtype=F32, causal=True,
                               softcap=5.0, sinks=True), F32)


def test_uneven_contiguous_shards(world2):
    """Shards of different lengths are handled: each rank learns the others' lengths."""
    dc.check_errors(world2.run(dc.fixed_length_case, api="ring", dtype=F32, causal=True,
                               lengths=[41, 23]), F32)


def test_zigzag_length_not_divisible(world4):
    """2P = 8 does not divide 61: chunks of 7 and 8 tokens."""
    dc.check_errors(world4.run(dc.fixed_length_case, api="zigzag", dtype=F32, causal=True,
                               seqlen=61), F32)


def test_process_subgroups(world4):
    """group=: two rings of 2 ranks side by side in a world of 4, each on its own batch."""
    dc.check_errors(world4.run(dc.fixed_length_case, api="zigzag", dtype=F32, causal=True,
                               subgroup_size=2), F32)


def _lse_and_packed_forms(rank, world):
    """return_attn_probs gives one process's LSE for this rank's rows; the qkv- and
    kv-packed forms give the unpacked functions' outputs."""
    torch.manual_seed(4)
    qkv = torch.randn(2, 48, 3, 4, 16)
    q, k, v = qkv.unbind(2)
    _, want_lse, _ = ipex_flash.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    errors = []
    for name, shard in (("ring", ifd.contiguous_shard), ("zigzag_ring", ifd.zigzag_shard)):
        local = shard(qkv, rank, world)
        ql, kl, vl = local.unbind(2)
        fn = getattr(ifd, f"{name}_flash_attn_func")
        out, lse, probs = fn(ql, kl, vl, causal=True, return_attn_probs=True)
        assert probs is None
        errors.append(dc.max_error(lse, shard(want_lse, rank, world, dim=2)))
        errors.append(dc.max_error(getattr(ifd, f"{name}_flash_attn_qkvpacked_func")(
            local, causal=True), out))
        errors.append(dc.max_error(getattr(ifd, f"{name}_flash_attn_kvpacked_func")(
            ql, local[:, :, 1:], causal=True), out))
    return errors


def test_lse_and_packed_forms(world2):
    for errors in world2.run(_lse_and_packed_forms):
        assert max(errors) <= 1e-5, errors


def test_multi_query_and_head_dims(world2):
    dc.check_errors(world2.run(dc.fixed_length_case, api="zigzag", dtype=F32, causal=True,
                               heads=(4, 1), head_dim=59), F32)


FULL_CASES = [(kind, dtype, causal, window)
              for kind in ("ring", "zigzag") for dtype in (F32, F16, BF16)
              for causal in (False, True) for window in ((-1, -1), (9, -1), (5, 3))]


@pytest.mark.full
@pytest.mark.parametrize("kind,dtype,causal,window", FULL_CASES)
def test_four_ranks_grid(world4, kind, dtype, causal, window):
    dc.check_errors(world4.run(dc.fixed_length_case, api=kind, dtype=dtype, causal=causal,
                               window=window, seqlen=96, softcap=3.0 if causal else 0.0,
                               sinks=not causal), dtype)
