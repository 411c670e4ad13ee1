"""What the ranks of a group agreed on, learned once and remembered, so that a warm call makes
no collective and reads nothing back from the device beyond what its kernels do.

The first call with a given key (this rank's shapes, dtype, options and group, plus the
identity of tensors whose values matter, such as cu_seqlens) runs `learn`: one or two small
all_gathers of every rank's arguments, the agreement checks (a difference raises the same
ValueError on every rank), and what is derived from them (every rank's shard length, the
plan, index tensors). Later calls with the same key reuse that.

A tensor in the key is named by identity and version: the same Python object, not modified
in place since (its `_version` counts in-place writes). A new cu_seqlens tensor (a new batch)
is learned again, once, and every layer of the model after the first reuses it.

The cost of remembering: a rank decides alone whether it has seen its arguments. If the
arguments change on some ranks but not on others (say contiguous shards going from [5, 5] to
[5, 6] tokens, where rank 0 sees nothing new), the ranks that see a change gather while the
others go on to the ring, and every rank raises when the group's timeout runs out. Setting
IPEX_FLASH_DISTRIBUTED_CHECKS=1 makes every call learn anew (the all_gathers and host reads
on every call), which turns such a change into the ValueError or correct result of the first
call.
"""
from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

ENV_SWITCH = "IPEX_FLASH_DISTRIBUTED_CHECKS"
_LIMIT = 256  # keys remembered; the oldest is forgotten first (the same on every rank)


class _Entry:
    __slots__ = ("value", "group", "anchors")

    def __init__(self, value, group, anchors):
        self.value = value
        self.group = group  # held, so that its id in the key cannot be reused by another group
        self.anchors = tuple(weakref.ref(t) for t in anchors)


_entries: "OrderedDict[tuple, _Entry]" = OrderedDict()


def checks_every_call() -> bool:
    return os.environ.get(ENV_SWITCH, "") == "1"


def agreed(group: dist.ProcessGroup, key: tuple, anchors: Sequence[torch.Tensor],
           learn: Callable[[], Any]) -> Any:
    """learn()'s value for this (group, key, anchors), computed on the first such call (and on
    every call with IPEX_FLASH_DISTRIBUTED_CHECKS=1). learn() raising remembers nothing."""
    full_key = (id(group), key, tuple((id(t), t._version) for t in anchors))
    entry = _entries.get(full_key)
    if (entry is not None and not checks_every_call() and entry.group is group
            and all(ref() is t for ref, t in zip(entry.anchors, anchors))):
        _entries.move_to_end(full_key)
        return entry.value
    value = learn()
    _entries[full_key] = _Entry(value, group, anchors)
    _entries.move_to_end(full_key)
    while len(_entries) > _LIMIT:
        _entries.popitem(last=False)
    return value


def forget() -> None:
    """Drops everything learned (tests; or after rebuilding process groups)."""
    _entries.clear()
