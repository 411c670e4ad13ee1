"""Launch plans of flash_attn_with_kvcache (ipex_flash/kvcache/fast_calls.py): contiguous, paged
and left-padded caches, appends, FP8 caches, rotary, cache_batch_idx and num_splits, repeated
with new data, lengths and pages each call against the float64 reference; and the cache's
values checked on every call."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash.reference import flash_attn_reference

from helpers.cache_checks import after_append, check, check_cache_attention, sequence_rows
from helpers.caches import make_cache, to_paged
from helpers.cases import DTYPES, PLAN_CALLS as CALLS
from helpers.fp8 import quantised_cache
from helpers.rotary import expected as rotary_expected


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "paged", "leftpad"])
@pytest.mark.parametrize("new_tokens", [0, 1, 3])
def test_kvcache_repeats(dtype, layout, new_tokens, plan_runs):
    """New cache contents, new lengths and new appended keys and values on every call of one
    signature: the cache holds exactly the appended rows, and attention sees them."""
    batch, capacity = 3, 160
    for call in range(CALLS):
        q = torch.randn(batch, new_tokens or 1, 8, 64, dtype=dtype)
        k_cache, v_cache = make_cache(batch, capacity, 2, 64, dtype)
        lengths = torch.randint(1, capacity + 1 - new_tokens, (batch,), dtype=torch.int32)
        lengths[call % batch] = capacity - new_tokens
        args = dict(cache_seqlens=lengths, causal=True, return_softmax_lse=True)
        k_in, v_in, starts, table = k_cache, v_cache, torch.zeros(batch, dtype=torch.int32), None
        if layout == "paged":
            k_in, v_in, table = to_paged(k_cache, v_cache, 32)
            args["block_table"] = table
        if layout == "leftpad":
            starts = (lengths * torch.rand(batch)).to(torch.int32)
            args["cache_leftpad"] = starts
        if new_tokens:
            args["k"], args["v"] = (torch.randn(batch, new_tokens, 2, 64, dtype=dtype)
                                    for _ in range(2))
        expected = [after_append(c, table, lengths, args[n]) if new_tokens else c.clone()
                    for c, n in ((k_in, "k"), (v_in, "v"))]
        out, lse = ipex_flash.flash_attn_with_kvcache(q, k_in, v_in, **args)
        assert torch.equal(k_in, expected[0]) and torch.equal(v_in, expected[1])
        check_cache_attention(out, lse, q, (k_in, v_in), table, starts, lengths + new_tokens,
                              dtype)
    assert plan_runs == [True] * (CALLS - 1)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_fp8_kvcache_repeats(fp8, per_head, paged, plan_runs):
    """FP8 caches with their descales (one value, or (batch, nheads_k)), and appends of keys and
    values already in the cache's dtype, on every call of one signature."""
    batch, capacity = 3, 200
    for _ in range(CALLS):
        (k_cache, v_cache), descales, (k64, v64) = quantised_cache(batch, capacity, 2, 64, fp8,
                                                                   per_head)
        q = torch.randn(batch, 1, 8, 64, dtype=torch.bfloat16)
        new = [torch.randn(batch, 1, 2, 64).to(fp8) for _ in range(2)]
        lengths = torch.randint(1, capacity, (batch,), dtype=torch.int32)
        table = None
        k_in, v_in = k_cache, v_cache
        if paged:
            k_in, v_in, table = to_paged(k_cache, v_cache, 32)
        out = ipex_flash.flash_attn_with_kvcache(
            q, k_in, v_in, *new, cache_seqlens=lengths, block_table=table,
            k_descale=descales[0], v_descale=descales[1])
        for b in range(batch):
            rows = slice(0, int(lengths[b]) + 1)
            keys, values = (sequence_rows(c, table, b, rows).double() for c in (k_in, v_in))
            scales = [d[b].view(1, -1, 1).double() if per_head else float(d) for d in descales]
            ref, _ = flash_attn_reference(q[b:b + 1], (keys * scales[0])[None],
                                          (values * scales[1])[None])
            check(out[b:b + 1], ref, torch.bfloat16)
            appended = sequence_rows(k_in, table, b, slice(rows.stop - 1, rows.stop))
            assert torch.equal(appended.view(torch.uint8), new[0][b].view(torch.uint8))
    assert plan_runs == [True] * (CALLS - 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (False, (50, 0))])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("rotary_dim,new", [(64, 1), (32, 3)])
@pytest.mark.parametrize("paged,float32_tables", [(False, False), (True, True)])
def test_rotary_kvcache_repeats(dtype, causal, window, interleaved, rotary_dim, new, paged,
                                float32_tables, plan_runs):
    """The rotary embedding of the new keys and of the queries, in the plan's append, at new
    positions and tables on every call (the tables in float32 or q's dtype)."""
    batch, capacity = 2, 192
    for _ in range(CALLS):
        k_cache, v_cache = make_cache(batch, capacity, 2, 64, dtype)
        before = k_cache.clone(), v_cache.clone()
        q = torch.randn(batch, new, 8, 64, dtype=dtype)
        k_new, v_new = (torch.randn(batch, new, 2, 64, dtype=dtype) for _ in range(2))
        seqlens = torch.randint(0, capacity - new + 1, (batch,), dtype=torch.int32)
        angles = torch.rand(capacity, rotary_dim // 2, dtype=torch.float64) * 2 * math.pi
        tables = [t.to(torch.float32 if float32_tables else dtype)
                  for t in (angles.cos(), angles.sin())]
        k_in, v_in, table = k_cache, v_cache, None
        if paged:
            k_in, v_in, table = to_paged(k_cache, v_cache, 32)
        out = ipex_flash.flash_attn_with_kvcache(
            q, k_in, v_in, k_new, v_new, *tables, seqlens, block_table=table, causal=causal,
            window_size=window, rotary_interleaved=interleaved)
        # the reference rotates with the tables as given (rounded to the dtype or not)
        used = torch.atan2(tables[1].double(), tables[0].double())
        want = rotary_expected(q, *before, k_new, v_new, seqlens, [0, 1], causal, used,
                               interleaved, window)
        check(out, want, dtype)
    assert plan_runs == [True] * (CALLS - 1)


def test_cache_values_checked_on_every_call(plan_runs):
    """A repeated call of a planned signature with lengths beyond the cache, or pages outside
    it, raises the general path's errors."""
    q = torch.randn(2, 1, 4, 32)
    k_cache, v_cache = make_cache(2, 64, 2, 32, torch.float32)
    k_pages, v_pages, table = to_paged(k_cache, v_cache, 16)
    lengths = torch.tensor([10, 64], dtype=torch.int32)
    for _ in range(2):
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
        ipex_flash.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lengths,
                                           block_table=table)
    assert plan_runs == [True, True]
    with pytest.raises(ValueError, match="exceeds the cache capacity"):
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache,
                                           cache_seqlens=torch.tensor([10, 65], dtype=torch.int32))
    bad_table = table.clone()
    bad_table[1, 2] = k_pages.shape[0]
    with pytest.raises(ValueError, match="block_table entries must be page indices"):
        ipex_flash.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lengths,
                                           block_table=bad_table)
    assert plan_runs[2:] == [False, False]
    new = torch.randn(2, 1, 2, 32)  # an append past the end
    for _ in range(2):
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=lengths - 1)
    with pytest.raises(ValueError, match="exceeds the cache capacity"):
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=lengths)
    assert plan_runs[4:] == [True, False]


def test_cache_batch_idx_repeats(plan_runs):
    """cache_batch_idx: each call's sequences read and append to other cache rows (a new
    permutation each call); the rows no sequence uses are untouched."""
    dtype = torch.bfloat16
    k_cache, v_cache = make_cache(5, 80, 2, 64, dtype)
    for _ in range(CALLS):
        rows = torch.randperm(5)[:3].to(torch.int32)
        lengths = torch.randint(0, 79, (3,), dtype=torch.int32)
        q, k, v = (torch.randn(3, 1, heads, 64, dtype=dtype) for heads in (8, 2, 2))
        expected = []
        for cache, new in ((k_cache, k), (v_cache, v)):
            want = cache.clone()
            want[rows.long(), lengths.long()] = new[:, 0]
            expected.append(want)
        out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths,
                                                 cache_batch_idx=rows)
        assert torch.equal(k_cache, expected[0]) and torch.equal(v_cache, expected[1])
        for b in range(3):
            keys = slice(0, int(lengths[b]) + 1)
            ref, _ = flash_attn_reference(q[b:b + 1], k_cache[rows[b], keys][None],
                                          v_cache[rows[b], keys][None])
            check(out[b:b + 1], ref, dtype)
    assert plan_runs == [True] * (CALLS - 1)


def test_any_num_splits_is_planned(plan_runs):
    """num_splits past any the keys allow (2^40 here) runs as the most there can be, in the
    general path as in the plan built after it."""
    k_cache, v_cache = make_cache(2, 64, 2, 32, torch.float32)
    for _ in range(CALLS):
        q = torch.randn(2, 1, 4, 32)
        lengths = torch.randint(1, 65, (2,), dtype=torch.int32)
        out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                                 num_splits=2**40)
        for b in range(2):
            keys = slice(0, int(lengths[b]))
            ref, _ = flash_attn_reference(q[b:b + 1], k_cache[b:b + 1, keys],
                                          v_cache[b:b + 1, keys])
            check(out[b:b + 1], ref, torch.float32)
    assert plan_runs == [True] * (CALLS - 1)
