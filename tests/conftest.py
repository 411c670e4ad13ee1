import os
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
from ipex_flash.reference import flash_attn_reference

# Property tests (test_properties.py): the same examples on every run (derandomize), no
# example database written into the tree, no per-example deadline (a first call compiles its
# kernel for seconds). A failure prints its falsifying case, whose seed remakes its tensors.
settings.register_profile("ipex_flash", derandomize=True, database=None, deadline=None)
settings.load_profile("ipex_flash")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (rtol, atol) of the kernel's output against the float64 reference computed from the same
# (already rounded) inputs: float32 accumulates like the reference; half types add one
# rounding of the output (2^-11 relative for float16, 2^-8 for bfloat16).
OUTPUT_TOLERANCE = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1e-2),
}
# The log-sum-exp is float32 for every input dtype.
LSE_TOLERANCE = (1e-5, 1e-5)


def tiered(values, default, multi=False):
    """`values` for pytest.mark.parametrize with those not in `default` marked "full": the
    default tier keeps the named cases (at least one of every feature, dtype and mask), the
    long tier (`-m full`) runs the whole grid. multi: each value is a tuple of several
    arguments."""
    full = pytest.mark.full
    return [v if v in default else
            pytest.param(*(v if multi else (v,)), marks=full) for v in values]


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Every test draws fresh inputs from a seed of its own (stable across runs, so a failure
    reproduces)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def random_qkv(batch, heads_q, heads_kv, len_q, len_k, head_dim, dtype, layout="bhnd"):
    """q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D). layout "bnhd" makes them as (B, N, H, D)
    and transposes to (B, H, N, D) without a copy, as models with that layout do."""
    def make(heads, n):
        if layout == "bnhd":
            return torch.randn(batch, n, heads, head_dim, dtype=dtype).transpose(1, 2)
        return torch.randn(batch, heads, n, head_dim, dtype=dtype)

    return make(heads_q, len_q), make(heads_kv, len_k), make(heads_kv, len_k)


def assert_matches_reference(out, lse, ref_out, ref_lse, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref_out, rtol=rtol, atol=atol)
    if lse is not None:
        assert lse.dtype == torch.float32
        torch.testing.assert_close(lse.double(), ref_lse, rtol=LSE_TOLERANCE[0], atol=LSE_TOLERANCE[1])


# KV caches for flash_attn_with_kvcache (test_kvcache.py, test_matrix_path.py).


def make_cache(batch, capacity, heads_kv, head_dim, dtype):
    return (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype),
            torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype))


def to_paged(k_cache, v_cache, page_size):
    """The same cache as pages in a shuffled pool, plus spare pages, and its block table; a
    page size that does not divide the capacity leaves the last page partly random."""
    batch, capacity, heads, dim = k_cache.shape
    per_seq = -(-capacity // page_size)
    pool = batch * per_seq + 3
    order = torch.randperm(pool)[: batch * per_seq].reshape(batch, per_seq).to(torch.int32)
    k_pages = torch.randn(pool, page_size, heads, dim).to(k_cache.dtype)  # (FP8 has no randn)
    v_pages = torch.randn(pool, page_size, heads, v_cache.shape[3]).to(v_cache.dtype)
    for b in range(batch):
        for p in range(per_seq):
            rows = slice(p * page_size, min((p + 1) * page_size, capacity))
            k_pages[order[b, p], :rows.stop - rows.start] = k_cache[b, rows]
            v_pages[order[b, p], :rows.stop - rows.start] = v_cache[b, rows]
    return k_pages, v_pages, order


def check_against_reference(out, lse, q, k_cache, v_cache, lengths, dtype, **options):
    """Sequence b's output and LSE against the float64 reference over its first lengths[b]
    cache rows; ALiBi slopes of shape (B, Hq) give each sequence its own row."""
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    slopes = options.pop("alibi_slopes", None)
    for b, length in enumerate(lengths):
        if slopes is not None:
            options["alibi_slopes"] = slopes[b] if slopes.dim() == 2 else slopes
        ref_out, ref_lse = flash_attn_reference(q[b:b + 1], k_cache[b:b + 1, :length],
                                                v_cache[b:b + 1, :length], **options)
        torch.testing.assert_close(out[b:b + 1].double(), ref_out, rtol=rtol, atol=atol)
        finite = ~torch.isneginf(ref_lse)
        assert torch.equal(torch.isneginf(lse[b:b + 1]), ~finite)
        torch.testing.assert_close(lse[b:b + 1].double()[finite], ref_lse[finite],
                                   rtol=LSE_TOLERANCE[0], atol=LSE_TOLERANCE[1])


def cache_in_layout(layout, batch, capacity, heads_kv, head_dim, dtype):
    """A (B, N, H, D) cache view: contiguous, head-major memory seen through a transpose, or
    starting one element into its storage (16-bit rows then miss 4-byte alignment)."""
    if layout == "head_major":
        return (torch.randn(batch, heads_kv, capacity, head_dim, dtype=dtype).transpose(1, 2),
                torch.randn(batch, heads_kv, capacity, head_dim, dtype=dtype).transpose(1, 2))
    if layout == "offset":
        size = batch * capacity * heads_kv * head_dim
        return tuple(torch.randn(size + 1, dtype=dtype)[1:].view(batch, capacity, heads_kv, head_dim)
                     for _ in range(2))
    return make_cache(batch, capacity, heads_kv, head_dim, dtype)


# Launch plans (test_launch_plans.py, test_cache_launch_plans.py).

PLAN_CALLS = 3  # the first builds the plan, the others run it


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
