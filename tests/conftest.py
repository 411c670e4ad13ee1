import os
import posixpath
import tempfile
import zlib

import pytest

# Hypothesis caches what it reads from the tests' sources in a .hypothesis directory, in the
# working directory unless told otherwise: outside the tree.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(tempfile.gettempdir(), "ipex_flash-hypothesis"))
from hypothesis import settings  # noqa: E402

import ipex_flash  # noqa: F401  (registers the ops; imported before torch, see _runtime.py)
import torch
from ipex_flash._runtime import C
from ipex_flash.ops import launch, launch_plans

# Property tests (test_properties.py): the same examples on every run (derandomize), no
# example database written into the tree, no per-example deadline (a first call compiles its
# kernel for seconds). A failure prints its falsifying case, whose seed remakes its tensors.
settings.register_profile("ipex_flash", derandomize=True, database=None, deadline=None)
settings.load_profile("ipex_flash")



@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Every test draws fresh inputs from a seed of its own (stable across runs, so a failure
    reproduces): the CRC of its node id without the area folder (tests/forward/test_forward.py
    seeds as tests/test_forward.py, the path it had before the tests were laid out by area, so
    the move kept every test's inputs)."""
    path, sep, name = request.node.nodeid.partition("::")
    flat = posixpath.join(posixpath.dirname(posixpath.dirname(path)), posixpath.basename(path))
    torch.manual_seed(zlib.crc32((flat + sep + name).encode()))


# Launch plans (test_launch_plans.py, test_kvcache_call_plans.py, test_serving_step_plans.py;
# helpers.cases.PLAN_CALLS).


@pytest.fixture
def plan_runs(monkeypatch):
    """Counts the calls a plan served; plans start empty."""
    launch_plans.clear()
    served = []
    real = launch_plans.run
    monkeypatch.setattr(launch_plans, "run", lambda *a, **kw: served.append(real(*a, **kw))
                        or served[-1])
    yield served
    launch_plans.clear()


@pytest.fixture
def device_seam(monkeypatch, plan_runs):
    """Calls after enter() take the XPU path (the queue-handle seam on the CPU device, as a
    device that does not share host memory); reads of the cache's values that the host waits
    for (C.cache_value_reads) must not happen unless IPEX_FLASH_SYNC_CACHE_CHECKS is set."""
    handle = C.cpu_queue_handle()
    reads = C.cache_value_reads()

    def enter():
        monkeypatch.setattr(launch, "queue_handle", lambda device: handle)
        monkeypatch.setattr(launch_plans, "reads_host_memory", lambda device: False)

    yield enter, plan_runs
    if not launch_plans.SYNC_CACHE_CHECKS:
        assert C.cache_value_reads() == reads, "the host waited for a read of the cache's values"
