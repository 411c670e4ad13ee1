"""What the distributed attention asks of torch.distributed, and nothing below it: the ring's
point-to-point exchanges (batch_isend_irecv; with a window, between the ranks it joins), small all_gathers of every rank's shapes the
first time it sees them (_agreement.py), and all_to_all_single for Ulysses. Any process group works (gloo on CPU tensors, xccl
on XPU ones); a rank that stops answering makes the others raise when the group's timeout
(init_process_group(timeout=...)) runs out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

Tensor = torch.Tensor


def resolve_group(fn: str, group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{fn}: torch.distributed is not initialized: call "
                           "torch.distributed.init_process_group first")
    group = dist.group.WORLD if group is None else group
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{fn}: group must be a torch.distributed.ProcessGroup or None, got "
                        f"{type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise ValueError(f"{fn}: this process is not a member of group")
    return group


class RingComm:
    """The ring of a process group: rank r sends to r+1 and receives from r-1."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        # P2POp takes global ranks.
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def exchange(self, send: Sequence[Tensor], recv: Sequence[Tensor]) -> "Pending":
        """Posts the sends of `send` to the next rank and the receives into `recv` from the
        previous one, and returns at once: the caller computes while they travel. Every rank
        posts its exchanges in the same order, which is how the receives match the sends."""
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in send]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in recv]
        return Pending(dist.batch_isend_irecv(ops), list(send), list(recv))

    def exchange_peers(self, send: Sequence[Tensor], send_to: Optional[int],
                       recv: Sequence[Tensor], recv_from: Optional[int]) -> "Pending":
        """As exchange, with any two ranks of the group (group ranks; None: no send or no
        receive): the window-aware exchange (_window_exchange.py) talks only to the ranks a
        window lets see each other, which need not be neighbours."""
        ops = []
        if send_to is not None:
            peer = dist.get_global_rank(self.group, send_to)
            ops += [dist.P2POp(dist.isend, t, peer, self.group) for t in send]
        if recv_from is not None:
            peer = dist.get_global_rank(self.group, recv_from)
            ops += [dist.P2POp(dist.irecv, t, peer, self.group) for t in recv]
        works = dist.batch_isend_irecv(ops) if ops else []
        return Pending(works, list(send) if send_to is not None else [],
                       list(recv) if recv_from is not None else [])


@dataclass
class Pending:
    works: list
    send: list  # referenced until sent: the buffers must outlive the transfers
    recv: list

    def wait(self) -> list[Tensor]:
        for work in self.works:
            work.wait()
        self.send = []
        return self.recv


def gather_ints(values: Sequence[int], device: torch.device,
                group: dist.ProcessGroup) -> list[list[int]]:
    """Every rank's `values` (the same count on each), through one all_gather of an int64
    tensor on the collective's device."""
    mine = torch.tensor(list(values), dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    return [t.tolist() for t in everyone]


def check_same(fn: str, gathered: list[list[int]], names: Sequence[str]) -> None:
    """Raises on every rank alike (they all hold the same gathered values) when a value that
    must agree differs between ranks."""
    for index, name in enumerate(names):
        values = [row[index] for row in gathered]
        if len(set(values)) > 1:
            raise ValueError(f"{fn}: {name} differs between the ranks of the group: {values}")


def all_to_all(output: Tensor, input: Tensor, output_split_sizes: Optional[list[int]],
               input_split_sizes: Optional[list[int]], group: dist.ProcessGroup) -> Tensor:
    dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=group)
    return output
