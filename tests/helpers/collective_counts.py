"""Counts the torch.distributed calls a piece of code makes: a context manager that wraps
torch.distributed's collectives by name (the code looks them up when it calls them) and
counts each call, batch_isend_irecv by its number of point-to-point ops."""
from collections import Counter

import torch.distributed as dist

NAMES = ("all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object",
         "all_reduce", "all_to_all", "all_to_all_single", "barrier", "broadcast", "gather",
         "reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
         "scatter", "batch_isend_irecv")


class CollectiveCounts:
    def __init__(self):
        self.counts = Counter()
        self._saved = []

    def __enter__(self):
        for name in NAMES:
            if hasattr(dist, name):
                original = getattr(dist, name)

                def counted(*args, _name=name, _original=original, **kwargs):
                    self.counts[_name] += len(args[0]) if _name == "batch_isend_irecv" else 1
                    return _original(*args, **kwargs)
                setattr(dist, name, counted)
                self._saved.append((name, original))
        return self

    def __exit__(self, *exc):
        for name, original in reversed(self._saved):
            setattr(dist, name, original)
        return False
