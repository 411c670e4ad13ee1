"""Which kernel calls one rank makes against one K/V shard: the ring's plan, pure Python.

A rank's tokens are a list of segments, each a run of consecutive global positions stored
consecutively in the local tensor (one segment for the plain ring, two for zigzag). The
global mask is flash-attn's on the whole sequence (queries and keys of equal length, so its
bottom-right alignment is also top-left): query p sees key t when

    -left <= t - p <= right        (causal: right = 0; -1: that side unbounded).

The kernels take one rectangle of queries and keys and a window around its own diagonal
(query row i sits at key column i + n_k - n_q). A shard pair is cut into such calls:
each call's rows and columns are trimmed to those that see something (rows outside see
nothing from this shard and are left to the other steps), which also makes its band contain
its own diagonal, so its window is two non-negative bounds. Calls that would cover several
segments are made only when the kernel's mask over them equals the global mask (checked per
segment pair), e.g. zigzag's own-shard step is one causal call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

INF = math.inf


@dataclass(frozen=True)
class Segment:
    start: int    # global position of its first token
    length: int


@dataclass(frozen=True)
class BlockCall:
    q_rows: tuple[int, int]   # [start, stop) of this rank's local queries
    k_rows: tuple[int, int]   # [start, stop) of the visited shard's local keys
    window: tuple[int, int]   # the kernel's (left, right) around the call's diagonal, -1 unbounded
    # Global positions of the call's first query and first key, when its rows and keys are
    # runs of consecutive positions (plan_pair with placed): dropout and ALiBi read them.
    starts: Optional[tuple[int, int]] = field(default=None, compare=False)

    def visible_pairs(self) -> int:
        """(query, key) pairs the call attends to: the work it does."""
        n_q, n_k = (r[1] - r[0] for r in (self.q_rows, self.k_rows))
        left, right = self.window
        diag = n_k - n_q
        total = 0
        for i in range(n_q):  # plans are built once per call: O(rows) is cheap beside attention
            lo = 0 if left < 0 else max(0, i + diag - left)
            hi = n_k - 1 if right < 0 else min(n_k - 1, i + diag + right)
            total += max(0, hi - lo + 1)
        return total


def band(causal: bool, window: tuple[int, int]) -> tuple[float, float]:
    """The global mask as the range of t - p a query sees."""
    left, right = window
    low = -left if left >= 0 else -INF
    high = 0 if causal else (right if right >= 0 else INF)
    return low, high


def rectangle_call(q_rows: tuple[int, int], q_start: int, k_rows: tuple[int, int], k_start: int,
                   low: float, high: float) -> Optional[BlockCall]:
    """The call for local queries q_rows at global positions q_start.. and keys k_rows at
    k_start.., or None when no query sees any key."""
    n_q, n_k = q_rows[1] - q_rows[0], k_rows[1] - k_rows[0]
    # Local row i sees local column j when a <= j - i <= b.
    a, b = low + q_start - k_start, high + q_start - k_start
    i0, i1 = max(0, -b), min(n_q - 1, n_k - 1 - a)
    j0, j1 = max(0, a), min(n_k - 1, n_q - 1 + b)
    if i0 > i1 or j0 > j1 or a > b:
        return None
    i0, i1, j0, j1 = int(i0), int(i1), int(j0), int(j1)
    a, b = a + i0 - j0, b + i0 - j0  # relative to the trimmed rectangle
    n_q, n_k = i1 - i0 + 1, j1 - j0 + 1
    diag = n_k - n_q
    # A bound that hides nothing in the rectangle is the unbounded -1 (one canonical form, so
    # equal masks give equal calls).
    left = -1 if a <= -(n_q - 1) else int(diag - a)
    right = -1 if b >= n_k - 1 else int(b - diag)
    assert left >= -1 and right >= -1, (left, right)  # trimming puts the diagonal in the band
    return BlockCall((q_rows[0] + i0, q_rows[0] + i1 + 1), (k_rows[0] + j0, k_rows[0] + j1 + 1),
                     (left, right), (q_start + i0, k_start + j0))


def _local_ranges(segments: Sequence[Segment]) -> list[tuple[int, int]]:
    ranges, offset = [], 0
    for seg in segments:
        ranges.append((offset, offset + seg.length))
        offset += seg.length
    return ranges


def _combined(q_segs, q_ranges, k_segs, k_ranges, low, high):
    """One call over all these segments, if the kernel's mask over them (positions read as
    consecutive, anchored at the first or the last segment) is the global mask: returns
    (True, call or None), else (False, None)."""
    def pretend(segs, ranges, anchor):
        # Global start each segment would have if the local rows were consecutive positions.
        ref, ref_range = segs[anchor], ranges[anchor]
        return [ref.start + (r[0] - ref_range[0]) for r in ranges]

    for anchor in (0, -1):
        q_pre, k_pre = pretend(q_segs, q_ranges, anchor), pretend(k_segs, k_ranges, anchor)
        if all(rectangle_call(qr, qp, kr, kp, low, high)
               == rectangle_call(qr, qs.start, kr, ks.start, low, high)
               for qs, qr, qp in zip(q_segs, q_ranges, q_pre)
               for ks, kr, kp in zip(k_segs, k_ranges, k_pre)):
            whole_q, whole_k = (q_ranges[0][0], q_ranges[-1][1]), (k_ranges[0][0], k_ranges[-1][1])
            call = rectangle_call(whole_q, q_pre[0], whole_k, k_pre[0], low, high)
            # Positions read as consecutive across segments: no global starts.
            return True, None if call is None else replace(call, starts=None)
    return False, None


def _group_calls(outer, outer_ranges, inner, inner_ranges, low, high, q_outer):
    """Calls with each outer segment against all inner segments combined (or pair by pair)."""
    calls = []
    for seg, rng in zip(outer, outer_ranges):
        args = (([seg], [rng], inner, inner_ranges) if q_outer
                else (inner, inner_ranges, [seg], [rng]))
        ok, call = _combined(*args, low, high)
        if ok:
            calls.append(call)
            continue
        for iseg, irng in zip(inner, inner_ranges):
            calls.append(rectangle_call(rng, seg.start, irng, iseg.start, low, high) if q_outer
                         else rectangle_call(irng, iseg.start, rng, seg.start, low, high))
    return [c for c in calls if c is not None]


def plan_pair(q_segs: Sequence[Segment], k_segs: Sequence[Segment], causal: bool,
              window: tuple[int, int], placed: bool = False) -> list[BlockCall]:
    """The fewest calls found for this rank's queries against one K/V shard; placed: one
    call per pair of segments, so that each call's rows and keys are runs of consecutive
    global positions (its starts are then the global ones)."""
    low, high = band(causal, window)
    q_ranges, k_ranges = _local_ranges(q_segs), _local_ranges(k_segs)
    if placed:
        calls = (rectangle_call(qr, qs.start, kr, ks.start, low, high)
                 for qs, qr in zip(q_segs, q_ranges) for ks, kr in zip(k_segs, k_ranges))
        return [c for c in calls if c is not None]
    ok, call = _combined(q_segs, q_ranges, k_segs, k_ranges, low, high)
    if ok:
        return [] if call is None else [call]
    by_q = _group_calls(q_segs, q_ranges, k_segs, k_ranges, low, high, q_outer=True)
    by_k = _group_calls(k_segs, k_ranges, q_segs, q_ranges, low, high, q_outer=False)
    return by_q if len(by_q) <= len(by_k) else by_k


def contiguous_layout(lengths: Sequence[int]) -> list[list[Segment]]:
    """Each rank's segments when rank p holds the p-th consecutive slice of the sequence."""
    layout, start = [], 0
    for n in lengths:
        layout.append([Segment(start, n)])
        start += n
    return layout


def zigzag_bounds(total: int, world_size: int) -> list[int]:
    """Boundaries of the 2P chunks of a sequence of `total` tokens (lengths differ by at most
    one when 2P does not divide it)."""
    chunks = 2 * world_size
    return [c * total // chunks for c in range(chunks + 1)]


def zigzag_layout(total: int, world_size: int) -> list[list[Segment]]:
    """Rank r holds chunks r and 2P-1-r, in that order."""
    bounds = zigzag_bounds(total, world_size)
    chunk = lambda c: Segment(bounds[c], bounds[c + 1] - bounds[c])  # noqa: E731
    return [[chunk(r), chunk(2 * world_size - 1 - r)] for r in range(world_size)]


def stripe_pair(q_len: int, rank: int, k_len: int, owner: int, world_size: int, causal: bool,
                window: tuple[int, int]) -> list[BlockCall]:
    """Stripe layout (token t on rank t mod P, in order): local query i of `rank` is at
    global position i P + rank, local key j of `owner` at j P + owner, so t - p = (j - i) P +
    (owner - rank) and the global band low <= t - p <= high is, in local positions, the band
    ceil((low - shift) / P) <= j - i <= floor((high - shift) / P), shift = owner - rank: one
    call, a rectangle with that band (causal against a later rank: q[1:] against k[:-1])."""
    low, high = band(causal, window)
    shift = owner - rank
    local_low = low if low == -INF else math.ceil((low - shift) / world_size)
    local_high = high if high == INF else math.floor((high - shift) / world_size)
    call = rectangle_call((0, q_len), 0, (0, k_len), 0, local_low, local_high)
    return [] if call is None else [replace(call, starts=None)]  # strided: no global starts
