"""stripe_flash_attn_func (token t on rank t mod P) at 2 and 4 ranks over gloo on the SYCL CPU
device: forward and gradients against one process's flash_attn_func and float64, lengths
that P does not divide, windows in global positions, GQA, softcap, sinks, bfloat16; the plan
covers every visible pair once (no processes); stripe_shard is the layout by hand; causal=False
refused as ring-flash-attention does."""
from helpers import distributed_cases as dc
import pytest
import torch

import ipex_flash
from ipex_flash import distributed as ifd
from ipex_flash.distributed import _blocks

F32, BF16 = torch.float32, torch.bfloat16


def _coverage(call, n_q, n_k):
    """The 0/1 matrix of the pairs a call attends to (the kernels' bottom-right diagonal)."""
    (qa, qb), (ka, kb) = call.q_rows, call.k_rows
    left, right = call.window
    rows, cols = torch.arange(qb - qa)[:, None], torch.arange(kb - ka)[None, :]
    diag = (kb - ka) - (qb - qa)
    seen = torch.ones(qb - qa, kb - ka, dtype=torch.bool)
    if left >= 0:
        seen &= cols >= rows + diag - left
    if right >= 0:
        seen &= cols <= rows + diag + right
    out = torch.zeros(n_q, n_k, dtype=torch.int32)
    out[qa:qb, ka:kb] = seen.int()
    return out


@pytest.mark.parametrize("world,total", [(1, 9), (2, 16), (2, 21), (3, 37), (4, 29)])
@pytest.mark.parametrize("causal", [False, True])
def test_stripe_plan_computes_every_visible_pair_once(world, total, causal):
    lengths = [(total - r + world - 1) // world for r in range(world)]
    for window in [(-1, -1), (0, 0), (3, -1), (-1, 2), (5, 1), (1, 7), (100, 0)]:
        low, high = _blocks.band(causal, window)
        for rank in range(world):
            for owner in range(world):
                q_pos = torch.arange(rank, total, world)
                k_pos = torch.arange(owner, total, world)
                offset = k_pos[None, :] - q_pos[:, None]
                want = ((offset >= low) & (offset <= high)).int()
                got = torch.zeros_like(want)
                for call in _blocks.stripe_pair(lengths[rank], rank, lengths[owner], owner,
                                                world, causal, window):
                    got += _coverage(call, len(q_pos), len(k_pos))
                assert torch.equal(got, want), (window, rank, owner)


def test_stripe_shard_by_hand_and_round_trip():
    x = torch.arange(10).view(1, 10)
    assert ifd.stripe_shard(x, 1, 3).tolist() == [[1, 4, 7]]
    assert ifd.stripe_shard(x, 0, 3, dim=-1).tolist() == [[0, 3, 6, 9]]
    for world in (1, 2, 3, 4):
        y = torch.randn(2, 23, 3)
        assert torch.equal(ifd.stripe_unshard([ifd.stripe_shard(y, r, world)
                                               for r in range(world)]), y)
    with pytest.raises(ValueError, match="shard 0 has 2"):
        ifd.stripe_unshard([torch.ones(1, 2), torch.ones(1, 3)])


def stripe_case(rank, world, **kwargs):
    """The shared fixed-length case with the stripe layout plugged in."""
    dc.FUNCTIONS["stripe"] = ifd.stripe_flash_attn_func
    shared_shard = dc.shard
    dc.shard = lambda x, r, w, api, lengths=None: (  # noqa: E731
        ifd.stripe_shard(x, r, w) if api == "stripe" else shared_shard(x, r, w, api, lengths))
    try:
        return dc.fixed_length_case(rank, world, api="stripe", causal=True, **kwargs)
    finally:
        dc.shard = shared_shard


@pytest.mark.parametrize("dtype,window,seqlen", [
    (F32, (-1, -1), 75),   # 38 and 37 tokens: P does not divide the length
    (F32, (13, -1), 64),   # a window in global positions
    (BF16, (-1, -1), 64),
])
def test_two_ranks(world2, dtype, window, seqlen):
    dc.check_errors(world2.run(stripe_case, dtype=dtype, window=window, seqlen=seqlen), dtype)


def test_gqa_softcap_and_sinks(world2):
    dc.check_errors(world2.run(stripe_case, dtype=F32, heads=(4, 1), softcap=5.0, sinks=True,
                               seqlen=50), F32)


def _forms_lse_and_refusal(rank, world):
    """The packed forms give the unpacked function's output; the LSE is one process's for
    this rank's rows; causal=False raises."""
    torch.manual_seed(5)
    whole = torch.randn(1, 41, 3, 2, 16)
    _, want_lse, _ = ipex_flash.flash_attn_func(*whole.unbind(2), causal=True,
                                                return_attn_probs=True)
    local = ifd.stripe_shard(whole, rank, world)
    q, k, v = local.unbind(2)
    out, lse, _ = ifd.stripe_flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    same = (torch.equal(ifd.stripe_flash_attn_qkvpacked_func(local, causal=True), out)
            and torch.equal(ifd.stripe_flash_attn_kvpacked_func(q, local[:, :, 1:],
                                                                 causal=True), out))
    lse_error = dc.max_error(lse, ifd.stripe_shard(want_lse, rank, world, dim=2))
    try:
        ifd.stripe_flash_attn_func(q, k, v)
    except ValueError as error:
        refused = "causal=False" in str(error)
    else:
        refused = False
    return same, lse_error < 1e-5, refused


def test_packed_forms_lse_and_non_causal_refused(world2):
    assert world2.run(_forms_lse_and_refusal) == [(True, True, True)] * 2


def test_four_ranks():
    """One world for both cases: 90 tokens (23, 23, 22, 22), a window in float32."""
    world = dc.World(4)
    try:
        dc.check_errors(world.run(stripe_case, dtype=F32, seqlen=90, window=(21, -1)), F32)
        dc.check_errors(world.run(stripe_case, dtype=BF16, seqlen=90, window=(-1, -1)), BF16)
    finally:
        world.close()
