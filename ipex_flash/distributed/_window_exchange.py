"""The window-aware exchange: with a sliding window, a rank's queries see the keys of a few
ranks only (its neighbours, when the window is shorter than a shard), so K/V go only from
each rank to the ranks whose queries see them, and dK/dV come back only from those, instead
of every shard travelling the whole ring.

Which ranks see which follows from the plan (_blocks.py): rank x needs owner o's K/V
exactly when x's calls against o's shard are not empty. Every rank plans every pair once
(the same lengths on every rank, learned with the agreement), so the two ends of each
transfer agree on it without a message.

The exchanges are direct, at offsets d = 1 .. P-1 in order: at offset d, rank r sends its own
K/V to r + d (mod P) if that rank needs them and receives the shard of r - d if it needs it.
The next offset's transfer is posted before the current shard's kernels run, as in the ring.
In the backward, the dK/dV a rank computed for another rank's shard go straight back to that
owner (float32) at the same offset, the reverse of the K/V transfer, and the owner adds them
to its own.

Every rank walks every offset, posting nothing where it has nothing to move: messages
between two ranks match in the order they are posted (no tags: NCCL-like backends ignore
them), and one pair can carry K/V one way and dK/dV the same way at different offsets, so
both ends must post in one global order, (K/V of offset d + 1, then dK/dV of offset d) for
d = 1, 2, ..., which skipping offsets on some ranks only would break.

No deadlock: a rank posts offset d's transfers only after waiting for those of smaller
offsets, and each wait at offset d needs only the peers' posts at offset d.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ipex_flash.distributed._ring_engine import (
    RingProblem, accumulators, add_sinks, backward_calls, forward_calls)

Tensor = torch.Tensor


@dataclass(frozen=True)
class PeerStep:
    offset: int                  # the shard computed on is that of rank - offset (mod P)
    send_to: Optional[int]       # group rank that receives this rank's own K/V, or None
    recv_from: Optional[int]     # group rank whose K/V this rank receives, or None


def peer_steps(needs: Sequence[Sequence[bool]], rank: int) -> Optional[list[PeerStep]]:
    """This rank's direct exchanges at offsets 1 .. P-1, given needs[x][o] (rank x's queries
    see some key of rank o) for every pair; None when every rank needs every other one,
    where the ring moves as much and only between neighbours."""
    world = len(needs)
    if all(needs[x][o] for x in range(world) for o in range(world) if x != o):
        return None
    steps = []
    for offset in range(1, world):
        to, source = (rank + offset) % world, (rank - offset) % world
        steps.append(PeerStep(offset, to if needs[to][rank] else None,
                              source if needs[rank][source] else None))
    return steps


def _post_kv(problem: RingProblem, own: list[Tensor], step: PeerStep):
    recv = ([problem.shard_like(t, step.recv_from) for t in own]
            if step.recv_from is not None else [])
    return problem.comm.exchange_peers(own, step.send_to, recv, step.recv_from)


def window_forward(problem: RingProblem, q: Tensor, k: Tensor, v: Tensor,
                   sinks: Optional[Tensor], backward_follows: bool) -> tuple[Tensor, Tensor]:
    """ring_forward's result over the direct exchanges of problem.peer_steps."""
    steps, rank = problem.peer_steps, problem.comm.rank
    out, lse = accumulators(problem, q, v)
    own = [k.contiguous(), v.contiguous()]
    pending = _post_kv(problem, own, steps[0]) if steps else None
    forward_calls(problem, q, own, rank, out, lse, backward_follows)
    for index, step in enumerate(steps):
        shard = pending.wait()
        pending = _post_kv(problem, own, steps[index + 1]) if index + 1 < len(steps) else None
        if step.recv_from is not None:
            forward_calls(problem, q, shard, step.recv_from, out, lse, backward_follows)
    if sinks is not None:
        add_sinks(out, lse, sinks)
    return out.to(q.dtype), lse


def window_backward(problem: RingProblem, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor,
                    out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """ring_backward's result over the direct exchanges of problem.peer_steps."""
    steps, rank = problem.peer_steps, problem.comm.rank
    grad_out = grad_out.contiguous()
    dq = torch.zeros_like(q, dtype=torch.float32)
    own = [k.contiguous(), v.contiguous()]
    pending = _post_kv(problem, own, steps[0]) if steps else None
    dk, dv = backward_calls(problem, grad_out, q, own, rank, out, lse, dq)
    grads_pending = None
    for index, step in enumerate(steps):
        shard = pending.wait()
        pending = _post_kv(problem, own, steps[index + 1]) if index + 1 < len(steps) else None
        parts = []
        if step.recv_from is not None:  # this rank's dK/dV for that owner's keys
            parts = list(backward_calls(problem, grad_out, q, shard, step.recv_from, out, lse,
                                        dq))
        # The rank this one sent K/V to at this offset sends back its dK/dV for them.
        theirs = ([torch.empty_like(t, dtype=torch.float32) for t in own]
                  if step.send_to is not None else [])
        posted = problem.comm.exchange_peers(parts, step.recv_from, theirs, step.send_to)
        if grads_pending is not None:  # the previous offset's, while this one's travel
            for total, part in zip((dk, dv), grads_pending.wait()):
                total.add_(part)
        grads_pending = posted
    if grads_pending is not None:
        for total, part in zip((dk, dv), grads_pending.wait()):
            total.add_(part)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
