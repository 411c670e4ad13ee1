"""Dropout and ALiBi on the rings, at 2 and 4 gloo ranks on the SYCL CPU device. The kernels
draw each block's keep-mask and measure its ALiBi distances at the block's global positions,
so a sharded call keeps exactly the probabilities one process keeps: every rank's output and
gradients are checked against float64 attention with the keep-mask one flash_attn_func call
draws for the same seed (dropout_mask), and against that call itself. A block drawn at its
local positions keeps another mask, and its error is of the size of the output."""
import dropout_cases
from helpers import distributed_cases as dc
import pytest
import torch

from ipex_flash import distributed as ifd
from ipex_flash.ops import launch

F32, BF16 = torch.float32, torch.bfloat16
SEED, P = dropout_cases.SEED, dropout_cases.P
_references = dropout_cases.references


def _fixed_length_case(rank, world, api, dtype, causal, window=(-1, -1), alibi=False,
                       seqlen=64, heads=(4, 2)):
    """This rank's out, dq, dk, dv with dropout (and ALiBi) against one process and float64."""
    batch = 2
    q, k, v, grad_out, _ = dc.draw((batch, seqlen), heads, 32, dtype)
    slopes = torch.rand(heads[0]) * 0.3 if alibi else None
    options = dict(dropout_p=P, causal=causal, window_size=window, alibi_slopes=slopes)
    cut = lambda t: dc.shard(t, rank, world, api)  # noqa: E731
    local = dc._leaves(*(cut(t) for t in (q, k, v)))
    torch.manual_seed(SEED)  # every rank draws the seed one process draws
    out = dc.FUNCTIONS[api](*local, **options)
    out.backward(cut(grad_out))
    got = [out] + [t.grad for t in local]
    torch.manual_seed(SEED)
    singles = dc.one_process(q, k, v, None, grad_out, **options)
    torch.manual_seed(SEED)
    seed = launch.draw_dropout_seed(q.device)
    keep = torch.ops.ipex_flash.dropout_mask(seed, [batch, heads[0], seqlen, seqlen], P)
    assert 0.6 < keep.float().mean().item() < 0.9  # the mask drops about P of the pairs
    wants = _references(q, k, v, keep, grad_out, dtype, causal, window, slopes)
    return dc.compare(got, singles, wants, dtype, cut, False, check_dtypes=True)


SHARDS = {"ring": ifd.varlen_shard, "zigzag": ifd.zigzag_varlen_shard}
VARLEN = {"ring": ifd.ring_flash_attn_varlen_func,
          "zigzag": ifd.zigzag_ring_flash_attn_varlen_func}


def _varlen_case(rank, world, api, causal, lengths, dropout_p=P, alibi=False):
    """The same over packed sequences, each split across the ranks (varlen_shard or
    zigzag_varlen_shard): every sequence's blocks sit at their own global offsets."""
    heads = (4, 2)
    q, k, v, grad_out, _ = dc.draw((sum(lengths),), heads, 32, F32)
    cu = dc.cu_seqlens(lengths)
    slopes = torch.rand(heads[0]) * 0.3 if alibi else None
    options = dict(dropout_p=dropout_p, causal=causal, alibi_slopes=slopes)
    cut = lambda t: SHARDS[api](t, cu, rank, world)[0]  # noqa: E731
    _, cu_local, longest = SHARDS[api](q, cu, rank, world)
    local = dc._leaves(*(cut(t) for t in (q, k, v)))
    torch.manual_seed(SEED)
    out = VARLEN[api](*local, cu_local, longest, **options)
    out.backward(cut(grad_out))
    got = [out] + [t.grad for t in local]
    torch.manual_seed(SEED)
    singles, _ = dc.one_process_varlen(q, k, v, None, grad_out, lengths, **options)
    torch.manual_seed(SEED)
    seed = launch.draw_dropout_seed(q.device)
    longest_whole = max(lengths)
    keep = (torch.ops.ipex_flash.dropout_mask(
        seed, [len(lengths), heads[0], longest_whole, longest_whole], dropout_p)
        if dropout_p > 0 else torch.ones(len(lengths), heads[0], longest_whole, longest_whole))
    wants = _references(q, k, v, keep, grad_out, F32, causal, (-1, -1), slopes, cu, dropout_p)
    return dc.compare(got, singles, wants, F32, cut, False)


@pytest.mark.parametrize("api,causal,alibi", [
    ("ring", False, False), ("ring", True, True), ("zigzag", True, False),
    ("zigzag", False, True)])
def test_varlen_dropout_two_ranks(world2, api, causal, alibi):
    """Sequences of 20, 44 and 12 tokens: every rank's slices start off the four-key groups."""
    dc.check_errors(world2.run(_varlen_case, api=api, causal=causal, lengths=[20, 44, 12],
                               alibi=alibi), F32)


@pytest.mark.parametrize("api", ["ring", "zigzag"])
def test_varlen_alibi_four_ranks(world4, api):
    dc.check_errors(world4.run(_varlen_case, api=api, causal=True, lengths=[24, 40],
                               dropout_p=0.0, alibi=True), F32)


@pytest.mark.parametrize("api,causal,window", [
    ("ring", False, (-1, -1)),
    ("ring", True, (-1, -1)),
    ("zigzag", True, (-1, -1)),
    ("zigzag", False, (-1, -1)),
    ("zigzag", True, (19, -1)),
    ("ring", False, (7, 11)),
])
def test_dropout_two_ranks(world2, api, causal, window):
    dc.check_errors(world2.run(_fixed_length_case, api=api, dtype=F32, causal=causal,
                               window=window), F32)


@pytest.mark.parametrize("api", ["ring", "zigzag"])
def test_dropout_with_alibi_four_ranks(world4, api):
    """Shards of 15 and (zigzag) chunks of 7 and 8: no block starts on a multiple of 4, where
    the keep-mask's words are drawn four keys at a time."""
    dc.check_errors(world4.run(_fixed_length_case, api=api, dtype=F32, causal=True, alibi=True,
                               seqlen=61, heads=(4, 1)), F32)


@pytest.mark.parametrize("api,dtype,causal,window", [
    ("ring", F32, False, (-1, -1)),
    ("ring", F32, True, (-1, -1)),
    ("zigzag", F32, True, (-1, -1)),
    ("zigzag", F32, False, (9, 5)),
    ("zigzag", BF16, True, (-1, -1)),
])
def test_alibi_two_ranks(world2, api, dtype, causal, window):
    dc.check_errors(world2.run(dc.fixed_length_case, api=api, dtype=dtype, causal=causal,
                               window=window, alibi=True), dtype)


def test_alibi_multi_query(world2):
    dc.check_errors(world2.run(dc.fixed_length_case, api="zigzag", dtype=F32, causal=True,
                               alibi=True, heads=(4, 1)), F32)
