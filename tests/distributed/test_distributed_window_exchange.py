"""Window-aware rings on 4 gloo ranks: with a window shorter than a shard, each rank sends its
K/V only to the ranks whose queries see them (and gets dK/dV back only from those). Counted
by wrapping torch.distributed.batch_isend_irecv: the bytes each rank sends equal those the
visible pairs of the whole sequence's mask call for (found by brute force over token
positions, not from the plan), which are fewer than the whole ring's; and the forward and
gradients match one process's flash_attn_func with the same window and float64
(distributed_cases.check_errors: 1e-5 relative in float32)."""
from helpers import distributed_cases as dc
import pytest
import torch
import torch.distributed as dist

from ipex_flash import distributed as ifd

F32, BF16 = torch.float32, torch.bfloat16
BATCH, HEAD_DIM = 2, 32  # fixed_length_case's defaults
SHARED_SHARD = dc.shard


def _shard(x, rank, world, api, lengths=None):
    if api == "stripe":
        return ifd.stripe_shard(x, rank, world)
    return SHARED_SHARD(x, rank, world, api, lengths)


def counted_case(rank, world, api, **kwargs):
    """fixed_length_case (one forward, one backward) with the stripe layout plugged in, and
    the bytes this rank sent point to point: (errors, bytes sent)."""
    dc.FUNCTIONS["stripe"] = ifd.stripe_flash_attn_func
    original = dist.batch_isend_irecv
    sent = []

    def counting(ops):
        sent.extend(op.tensor.nbytes for op in ops if op.op.__name__ == "isend")
        return original(ops)

    dc.shard = _shard
    dist.batch_isend_irecv = counting
    try:
        errors = dc.fixed_length_case(rank, world, api=api, **kwargs)
    finally:
        dc.shard, dist.batch_isend_irecv = SHARED_SHARD, original
    return errors, sum(sent)


def _needs(api, seqlen, world, causal, window, lengths):
    """needs[x][o]: some query of rank x sees some key of rank o under the global mask."""
    whole = torch.arange(seqlen).view(1, seqlen)
    positions = [shared[0] for shared in (_shard(whole, r, world, api, lengths)
                                          for r in range(world))]
    left, right = window
    needs = []
    for x in range(world):
        offset = torch.cat(positions)[None, :] - positions[x][:, None]  # key - query
        seen = torch.ones_like(offset, dtype=torch.bool)
        if left >= 0:
            seen &= offset >= -left
        if causal:
            seen &= offset <= 0
        elif right >= 0:
            seen &= offset <= right
        by_owner = seen.split([len(p) for p in positions], dim=1)
        needs.append([bool(block.any()) for block in by_owner])
    return needs, [len(p) for p in positions]


def _expected_bytes(needs, lengths, hkv, element):
    """Bytes each rank sends in a forward and backward of the window-aware exchange, and the
    whole ring's total: K/V (k and v) of its shard to every rank that sees them, twice (the
    backward fetches them again), and float32 dK/dV of every other shard it sees."""
    world = len(lengths)
    kv = [2 * BATCH * n * hkv * HEAD_DIM * element for n in lengths]
    grads = [2 * BATCH * n * hkv * HEAD_DIM * 4 for n in lengths]
    per_rank = []
    for r in range(world):
        receivers = sum(needs[x][r] for x in range(world) if x != r)
        owners = [o for o in range(world) if o != r and needs[r][o]]
        per_rank.append(2 * receivers * kv[r] + sum(grads[o] for o in owners))
    # The ring: every shard travels P-1 hops per pass, its dK/dV P hops.
    ring = sum(2 * (world - 1) * kv[o] + world * grads[o] for o in range(world))
    return per_rank, ring


CASES = [  # (api, dtype, causal, window, seqlen, extra arguments)
    ("ring", F32, True, (20, -1), 128, {}),                   # shards of 32: rank r - 1 only
    ("ring", F32, False, (7, 11), 128, {}),                   # ranks r - 1 and r + 1
    ("ring", F32, False, (10, 3), 128,                        # uneven shards, MQA, options
     dict(lengths=[41, 23, 30, 34], heads=(4, 1), softcap=5.0, sinks=True)),
    ("zigzag", F32, True, (13, -1), 128, {}),                 # chunks of 16: ranks r -+ 1
    ("stripe", F32, True, (2, -1), 90, {}),                   # tokens p - 1, p - 2: 2 of 3 ranks
    ("ring", BF16, True, (20, -1), 128, {}),
]


@pytest.mark.parametrize("api,dtype,causal,window,seqlen,extra", CASES)
def test_window_exchanges_only_with_ranks_it_joins(world4, api, dtype, causal, window, seqlen,
                                                   extra):
    results = world4.run(counted_case, api=api, dtype=dtype, causal=causal, window=window,
                         seqlen=seqlen, **extra)
    dc.check_errors([errors for errors, _ in results], dtype)
    needs, lengths = _needs(api, seqlen, 4, causal, window, extra.get("lengths"))
    hkv = extra.get("heads", (4, 2))[1]
    want, ring = _expected_bytes(needs, lengths, hkv, torch.finfo(dtype).bits // 8)
    got = [sent for _, sent in results]
    assert got == want, (got, want)
    assert sum(got) < ring, (sum(got), ring)


def test_a_window_every_rank_needs_keeps_the_ring(world4):
    """A window longer than a shard joins every pair: the ring's exchanges, byte for byte."""
    results = world4.run(counted_case, api="ring", dtype=F32, causal=False, window=(70, 70),
                         seqlen=128)
    dc.check_errors([errors for errors, _ in results], F32)
    needs, lengths = _needs("ring", 128, 4, False, (70, 70), None)
    assert all(all(row) for row in needs)
    _, ring = _expected_bytes(needs, lengths, 2, 4)
    assert sum(sent for _, sent in results) == ring
