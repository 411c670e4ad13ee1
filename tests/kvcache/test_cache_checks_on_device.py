"""flash_attn_with_kvcache's decode steps where the device does not share host memory (an XPU),
through the queue-handle seam on the CPU device: the plan reads no value of the cache on the
host and the host never waits for the device; the kernels stay within the cache whatever the
values; a check kernel after the attention sets the output to NaN where a value is out of
range, and the next call on the device raises the ValueError naming the argument. With
IPEX_FLASH_SYNC_CACHE_CHECKS=1 a kernel reads them before the attention, the host waits, and
the call raises at once."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.ops import launch_plans

from helpers.cache_checks import after_append, check_cache_attention
from helpers.caches import make_cache, to_paged
from helpers.cases import DTYPES

BATCH, CAPACITY, PAGE = 3, 192, 32


def step(q_heads, dtype, caches, table, lengths, new_tokens, starts=None):
    q = torch.randn(BATCH, max(new_tokens, 1), q_heads, 64, dtype=dtype)
    args = dict(cache_seqlens=lengths, block_table=table, cache_leftpad=starts,
                return_softmax_lse=True)
    if new_tokens:
        args["k"], args["v"] = (torch.randn(BATCH, new_tokens, 2, 64, dtype=dtype)
                                for _ in range(2))
    return q, args, ipex_flash.flash_attn_with_kvcache(q, *caches, **args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("new_tokens", [0, 1])
def test_valid_steps_read_nothing_on_the_host(dtype, paged, new_tokens, device_seam):
    """Short sequences in a long cache (the grid covers the capacity: most splits are empty),
    new lengths, contents and appends each step: the reference's answer, the appended rows and
    nothing else written."""
    enter, plan_runs = device_seam
    k_cache, v_cache = make_cache(BATCH, CAPACITY, 2, 64, dtype)
    caches, table = (k_cache, v_cache), None
    if paged:
        *caches, table = to_paged(k_cache, v_cache, PAGE)
    for call in range(4):
        if call == 1:
            enter()
        lengths = torch.randint(0, 60, (BATCH,), dtype=torch.int32)
        lengths[call % BATCH] = CAPACITY - new_tokens - call  # one long sequence
        expected = [c.clone() for c in caches]
        q, args, (out, lse) = step(8, dtype, caches, table, lengths, new_tokens)
        if new_tokens:
            expected = [after_append(c, table, lengths, args[n])
                        for c, n in zip(expected, ("k", "v"))]
        assert all(torch.equal(c, e) for c, e in zip(caches, expected))
        check_cache_attention(out, lse, q, caches, table, torch.zeros(BATCH, dtype=torch.int32),
                              lengths + new_tokens, dtype)
    assert plan_runs == [True] * 3


BAD_VALUES = {
    "cache_seqlens": lambda lengths, table, starts: (lengths.index_fill(0, torch.tensor([1]),
                                                                        CAPACITY), table, starts),
    "negative cache_seqlens": lambda lengths, table, starts: (
        lengths.index_fill(0, torch.tensor([2]), -5), table, starts),
    "block_table": lambda lengths, table, starts: (
        lengths, table.index_fill(1, torch.tensor([0]), 10_000), starts),
    "cache_leftpad": lambda lengths, table, starts: (lengths, table, lengths + 1),
}


@pytest.mark.parametrize("bad", list(BAD_VALUES))
def test_out_of_range_values_give_nan_then_raise(bad, device_seam):
    """A step with a value out of range returns NaN (output and LSE), writes nothing out of
    range into the cache, and the next step raises the ValueError naming the argument; the
    step after that runs again."""
    enter, plan_runs = device_seam
    dtype, paged = torch.bfloat16, bad == "block_table"
    k_cache, v_cache = make_cache(BATCH, CAPACITY, 2, 64, dtype)
    caches, table = (k_cache, v_cache), None
    if paged:
        *caches, table = to_paged(k_cache, v_cache, PAGE)
    lengths = torch.tensor([30, 50, 70], dtype=torch.int32)
    starts = None if paged else torch.tensor([0, 5, 9], dtype=torch.int32)
    step(8, dtype, caches, table, lengths, 1, starts)
    enter()
    bad_lengths, bad_table, bad_starts = BAD_VALUES[bad](lengths, table, starts)
    untouched = [c.clone() for c in caches]
    _, args, (out, lse) = step(8, dtype, caches, bad_table, bad_lengths, 1, bad_starts)
    assert out.isnan().all() and lse.isnan().all()
    if bad != "block_table":  # (the valid sequences' new rows, nowhere else)
        valid = [b for b in range(BATCH) if 0 <= bad_lengths[b] < CAPACITY and
                 (bad_starts is None or bad_starts[b] <= bad_lengths[b])]
        for cache, new, before in zip(caches, (args["k"], args["v"]), untouched):
            want = before.clone()
            for b in valid:
                want[b, bad_lengths[b]] = new[b, 0]
            assert torch.equal(cache, want)
    argument = bad.split()[-1]
    with pytest.raises(ValueError, match=argument):
        step(8, dtype, caches, table, lengths, 1, starts)
    q, _, (out, lse) = step(8, dtype, caches, table, lengths + 1, 1, starts)
    assert not out.isnan().any()
    check_cache_attention(out, lse, q, caches, table,
                          torch.zeros(BATCH, dtype=torch.int32) if starts is None else starts,
                          lengths + 2, dtype)
    assert plan_runs == [True, True]  # (the raising step raised before its run)


def test_sync_checks_raise_at_once(monkeypatch, device_seam):
    """IPEX_FLASH_SYNC_CACHE_CHECKS=1: each step reads the values on the device and waits
    (READ_ON_DEVICE), and the step with a length past the capacity raises itself, through
    the general path."""
    enter, plan_runs = device_seam
    dtype = torch.float32
    caches = make_cache(BATCH, CAPACITY, 2, 64, dtype)
    lengths = torch.tensor([30, 50, 70], dtype=torch.int32)
    step(8, dtype, caches, None, lengths, 0)
    enter()
    monkeypatch.setattr(launch_plans, "SYNC_CACHE_CHECKS", True)
    reads = C.cache_value_reads()
    q, _, (out, lse) = step(8, dtype, caches, None, lengths, 0)
    check_cache_attention(out, lse, q, caches, None, torch.zeros(BATCH, dtype=torch.int32),
                          lengths, dtype)
    with pytest.raises(ValueError, match="exceeds the cache capacity"):
        step(8, dtype, caches, None, lengths.index_fill(0, torch.tensor([0]), CAPACITY + 1), 0)
    assert C.cache_value_reads() - reads == 2 and plan_runs == [True, False]
