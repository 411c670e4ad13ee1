"""The ring's plan of kernel calls (ipex_flash/distributed/_blocks.py) and the shard helpers,
without processes: every (query, key) pair of the global mask is computed exactly once over
the ring, for contiguous and zigzag layouts, even and uneven lengths, causal masks and
windows; zigzag gives every rank the same causal work; each rank's zigzag shard is the
layout worked out by hand from its definition; shard/unshard round trips."""
import pytest
import torch

from ipex_flash import distributed as ifd
from ipex_flash.distributed import _blocks


def _call_coverage(call, n_q, n_k):
    """The (n_q, n_k) 0/1 matrix of the pairs the kernel attends to in this call."""
    (qa, qb), (ka, kb) = call.q_rows, call.k_rows
    left, right = call.window
    rows = torch.arange(qb - qa)[:, None]
    cols = torch.arange(kb - ka)[None, :]
    diag = (kb - ka) - (qb - qa)  # the kernels' bottom-right alignment
    seen = torch.ones(qb - qa, kb - ka, dtype=torch.bool)
    if left >= 0:
        seen &= cols >= rows + diag - left
    if right >= 0:
        seen &= cols <= rows + diag + right
    coverage = torch.zeros(n_q, n_k, dtype=torch.int32)
    coverage[qa:qb, ka:kb] = seen.int()
    assert int(seen.sum()) == call.visible_pairs()
    return coverage


def _positions(segments):
    return torch.cat([torch.arange(s.start, s.start + s.length) for s in segments])


def _layouts(world, total):
    lengths = [total // world + (p < total % world) for p in range(world)]
    return {"contiguous": _blocks.contiguous_layout(lengths),
            "zigzag": _blocks.zigzag_layout(total, world)}


WINDOWS = [(-1, -1), (0, 0), (3, -1), (-1, 2), (5, 1), (1, 7), (2, 2), (100, 0)]


@pytest.mark.parametrize("world,total", [(1, 9), (2, 16), (2, 21), (3, 37), (4, 32), (4, 29)])
@pytest.mark.parametrize("causal", [False, True])
def test_every_visible_pair_is_computed_once(world, total, causal):
    for kind, layout in _layouts(world, total).items():
        for window in WINDOWS:
            low, high = _blocks.band(causal, window)
            for rank in range(world):
                for owner in range(world):
                    q_pos, k_pos = _positions(layout[rank]), _positions(layout[owner])
                    offset = k_pos[None, :] - q_pos[:, None]
                    want = ((offset >= low) & (offset <= high)).int()
                    got = torch.zeros_like(want)
                    calls = _blocks.plan_pair(layout[rank], layout[owner], causal, window)
                    for call in calls:
                        got += _call_coverage(call, len(q_pos), len(k_pos))
                    assert torch.equal(got, want), (kind, window, rank, owner, calls)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_balances_causal_work(world):
    """Each rank attends to the same number of pairs, in one kernel call per K/V shard."""
    layout = _blocks.zigzag_layout(2 * world * 16, world)
    work = []
    for rank in range(world):
        plans = [_blocks.plan_pair(layout[rank], layout[o], True, (-1, -1)) for o in range(world)]
        assert all(len(p) == 1 for p in plans)
        work.append(sum(call.visible_pairs() for p in plans for call in p))
    assert len(set(work)) == 1, work
    contiguous = _blocks.contiguous_layout([32] * world)
    ring_work = [sum(c.visible_pairs() for o in range(world)
                     for c in _blocks.plan_pair(contiguous[r], contiguous[o], True, (-1, -1)))
                 for r in range(world)]
    assert ring_work == sorted(ring_work) and ring_work[0] < ring_work[-1]


def _zigzag_by_hand(total, world, rank):
    """The positions rank `rank` holds, from zigzag's definition: chunks rank and 2P-1-rank
    of 2P, in that order. Equal chunks when 2P divides the length; otherwise chunk c is
    [c * N // 2P, (c + 1) * N // 2P), lengths differing by at most one, the lengths the
    ring's check asks of each rank."""
    chunks = 2 * world
    if total % chunks == 0:
        equal = torch.arange(total).view(chunks, total // chunks)
        return torch.cat([equal[rank], equal[chunks - 1 - rank]]).tolist()
    chunk = lambda c: list(range(c * total // chunks, (c + 1) * total // chunks))  # noqa: E731
    return chunk(rank) + chunk(chunks - 1 - rank)


@pytest.mark.parametrize("total", [32, 24, 29, 9])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_zigzag_shard_holds_chunks_r_and_mirror(total, world):
    """Every rank's shard against the layout by hand, along dims 1, 0 and -1, and against
    the plan's layout (the positions the ring computes for)."""
    positions = torch.arange(total)
    x = positions.view(1, total, 1).expand(2, total, 3)
    layout = _blocks.zigzag_layout(total, world)
    for rank in range(world):
        want = _zigzag_by_hand(total, world, rank)
        got = ifd.zigzag_shard(x, rank, world)
        assert got.shape == (2, len(want), 3), (rank, got.shape)
        assert torch.equal(got, torch.tensor(want).view(1, -1, 1).expand(2, -1, 3)), rank
        assert ifd.zigzag_shard(positions, rank, world, dim=0).tolist() == want
        assert ifd.zigzag_shard(x.transpose(1, 2), rank, world, dim=-1)[0, 0].tolist() == want
        assert _positions(layout[rank]).tolist() == want


def test_zigzag_shard_literal():
    x = torch.arange(16).view(1, 16)
    assert ifd.zigzag_shard(x, 1, 2).tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    assert ifd.zigzag_shard(x, 0, 4, dim=-1).tolist() == [[0, 1, 14, 15]]


@pytest.mark.parametrize("total", [32, 29, 9])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_shards_round_trip(total, world):
    x = torch.randn(2, total, 3)
    zig = [ifd.zigzag_shard(x, r, world) for r in range(world)]
    assert torch.equal(ifd.zigzag_unshard(zig), x)
    plain = [ifd.contiguous_shard(x, r, world) for r in range(world)]
    assert torch.equal(ifd.contiguous_unshard(plain), x)


def test_varlen_shards_round_trip():
    cu = torch.tensor([0, 4, 16, 24], dtype=torch.int32)
    x = torch.randn(24, 2, 3)
    shards = [ifd.varlen_shard(x, cu, r, 4) for r in range(4)]
    assert all(torch.equal(s[1], cu // 4) and s[2] == 3 for s in shards)
    assert torch.equal(shards[1][0][:1], x[1:2])  # sequence 0's second quarter
    assert torch.equal(ifd.varlen_unshard([s[0] for s in shards], cu), x)


@pytest.mark.parametrize("call,words", [
    (lambda: ifd.zigzag_shard(torch.ones(1, 8), 2, 2), "rank"),
    (lambda: ifd.zigzag_shard(torch.ones(1, 8), 0, 0), "world_size"),
    (lambda: ifd.zigzag_shard([1, 2], 0, 2), "x must be a torch.Tensor"),
    (lambda: ifd.contiguous_shard(torch.ones(1, 8), 0, 2, dim=3), "dim"),
    (lambda: ifd.zigzag_unshard([torch.ones(1, 5), torch.ones(1, 3)]), "shard 0 has 5"),
    (lambda: ifd.varlen_shard(torch.ones(9, 1), torch.tensor([0, 3, 9]), 0, 2), "multiple"),
    (lambda: ifd.ring_flash_attn_qkvpacked_func(torch.ones(1, 8, 2, 2, 4)), "qkv"),
])
def test_helper_errors_name_the_argument(call, words):
    with pytest.raises((ValueError, TypeError), match=words):
        call()
