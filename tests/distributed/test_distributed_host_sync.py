"""Once warm, a distributed attention call makes no collective beyond the ring's point-to-point
exchange of K/V (and of dK/dV in the backward), and the distributed layer reads nothing back
from the device: counted on 2 gloo ranks by wrapping torch.distributed's functions and the
tensor methods that read values to the host. What the ranks agreed on is learned again for a
new cu_seqlens tensor, after one is modified in place, and on every call with
IPEX_FLASH_DISTRIBUTED_CHECKS=1."""
from collections import Counter
import os
import sys

from helpers import distributed_cases as dc
import pytest
import torch
import torch.distributed as dist

from ipex_flash import distributed as ifd

# Every torch.distributed entry point a call could use; isend/irecv are left alone (P2POp
# accepts only the originals) and counted through batch_isend_irecv's list of ops.
COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce",
               "broadcast", "barrier", "all_to_all", "all_to_all_single", "reduce_scatter",
               "reduce_scatter_tensor", "gather", "scatter", "reduce", "send", "recv",
               "batch_isend_irecv")
HOST_READS = ("tolist", "item", "cpu", "__int__", "__float__", "__bool__", "numpy")
DISTRIBUTED_DIR = os.path.dirname(ifd.__file__)


class Counting:
    """Counts torch.distributed calls and host reads made from ipex_flash.distributed's own
    code while active (the kernels' ops are not part of it)."""

    def __init__(self):
        self.counts = Counter()
        self._saved = []

    def _wrap(self, owner, name, label, only_ours):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if not only_ours or caller.startswith(DISTRIBUTED_DIR):
                self.counts[label] += len(args[0]) if name == "batch_isend_irecv" else 1
            return original(*args, **kwargs)
        setattr(owner, name, counted)
        self._saved.append((owner, name, original))

    def __enter__(self):
        for name in COLLECTIVES:
            if hasattr(dist, name):
                self._wrap(dist, name, f"dist.{name}", False)
        for name in HOST_READS:
            self._wrap(torch.Tensor, name, f"Tensor.{name}", True)
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)


def _fixed(api, rank, world, seqlen=37):
    torch.manual_seed(0)
    shard = {"ring": ifd.contiguous_shard, "zigzag_ring": ifd.zigzag_shard,
             "stripe": ifd.stripe_shard}[api]
    q, k, v = (shard(torch.randn(1, seqlen, 2, 16), rank, world).requires_grad_()
               for _ in range(3))
    fn = getattr(ifd, f"{api}_flash_attn_func")
    return lambda: fn(q, k, v, causal=True)


def _packed(api, rank, world):
    """A call with the same cu_seqlens object every time, as a model's layers make; the
    returned function takes another cu_seqlens to pass instead."""
    torch.manual_seed(0)
    cu = torch.tensor([0, 8, 20], dtype=torch.int32)
    shard = ifd.zigzag_varlen_shard if api == "zigzag_ring" else ifd.varlen_shard
    q, k, v = (shard(torch.randn(20, 2, 16), cu, rank, world)[0].requires_grad_()
               for _ in range(3))
    local_cu = cu // world
    fn = getattr(ifd, f"{api}_flash_attn_varlen_func")
    return lambda other_cu=None: fn(q, k, v, local_cu if other_cu is None else other_cu,
                                    20 // world, causal=True)


def _counted(call):
    """Counts of a forward alone and of a forward and backward."""
    with Counting() as forward:
        with torch.no_grad():
            call()
    with Counting() as training:
        call().sum().backward()
    return dict(forward.counts), dict(training.counts)


def _warm_counts(rank, world):
    results = {}
    calls = {api: _fixed(api, rank, world) for api in ("ring", "zigzag_ring", "stripe")}
    calls.update({f"{api}_varlen": _packed(api, rank, world) for api in ("ring", "zigzag_ring")})
    for name, call in calls.items():
        call().sum().backward()  # learns
        results[name] = _counted(call)
    # A new cu_seqlens tensor (same values), then the same one modified in place.
    call = _packed("ring", rank, world)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with Counting() as fresh:
        call(cu.clone())
    call(cu)
    cu.add_(0)
    with Counting() as modified:
        call(cu)
    results["new_cu"], results["modified_cu"] = dict(fresh.counts), dict(modified.counts)
    os.environ["IPEX_FLASH_DISTRIBUTED_CHECKS"] = "1"
    try:
        call = _fixed("zigzag_ring", rank, world)
        with Counting() as checked:
            call()
            call()
    finally:
        del os.environ["IPEX_FLASH_DISTRIBUTED_CHECKS"]
    results["checks_every_call"] = dict(checked.counts)
    return results


@pytest.fixture(scope="module")
def counts():
    world = dc.World(2)
    try:
        yield world.run(_warm_counts)
    finally:
        world.close()


@pytest.mark.parametrize("api", ["ring", "zigzag_ring", "stripe", "ring_varlen",
                                 "zigzag_ring_varlen"])
def test_warm_calls_exchange_only_kv_and_read_nothing(counts, api):
    """P = 2: the forward posts one K/V exchange (2 sends, 2 receives: k and v); the backward
    one more, and P = 2 exchanges of dK/dV; no all_gather, no host read."""
    for per_rank in counts:
        forward, training = per_rank[api]
        assert forward == {"dist.batch_isend_irecv": 4}, forward
        assert training == {"dist.batch_isend_irecv": 4 + 4 + 2 * 4}, training


def test_agreement_learned_again_when_cu_seqlens_changes(counts):
    for per_rank in counts:
        for case in ("new_cu", "modified_cu"):
            # One all_gather of the arguments, one of the offsets, one read of them.
            assert per_rank[case]["dist.all_gather"] == 2, (case, per_rank[case])
            assert per_rank[case]["Tensor.tolist"] >= 1, (case, per_rank[case])


def test_debug_switch_checks_every_call(counts):
    for per_rank in counts:
        assert per_rank["checks_every_call"]["dist.all_gather"] == 2, per_rank
