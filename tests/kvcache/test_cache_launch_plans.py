"""Launch plans of the KV-cache calls (ipex_flash/kvcache/fast_calls.py): flash_attn_with_kvcache
(contiguous, paged, left-padded; appends, FP8 caches, rotary) and the serving call's decode
steps, repeated with new data, lengths and pages each call against the float64 reference; the
cache's values checked on every call; and the XPU path (a queue by handle, the cache's values
read from the device) through a queue-handle seam on the CPU device."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.ops import launch, launch_plans
from ipex_flash.reference import flash_attn_reference, sdpa_reference

from helpers.cache_checks import after_append, check, check_cache_attention, sequence_rows
from helpers.caches import make_cache, paged_batch, to_paged
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


def serving_step(dtype, new_tokens, page_size=32):
    """A decode step of 5 sequences of 257-288 keys (9 pages each, so that the page pool and
    block table keep their shapes): out, cu_seqlens_q, the per-sequence tensors, and the inputs
    (referenced until the launch has run)."""
    lengths = [(new_tokens, int(n)) for n in torch.randint(8 * page_size + 1, 9 * page_size + 1, (5,))]
    inputs = paged_batch(lengths, 8, 2, 64, page_size, dtype)
    q, k_pages, v_pages, table, cu_q, seqused, seqs = inputs
    out = ipex_flash.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, None, new_tokens, 400,
                                            causal=True, block_table=table, seqused_k=seqused)
    return out, cu_q, seqs, inputs


def check_serving(out, cu_q, seqs, inputs, dtype):
    for b, (q_b, k_b, v_b) in enumerate(seqs):
        ref, _ = flash_attn_reference(q_b[None], k_b[None], v_b[None], causal=True)
        check(out[int(cu_q[b]):int(cu_q[b + 1])], ref[0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("new_tokens", [1, 3])
def test_serving_decode_repeats(dtype, new_tokens, plan_runs):
    """The serving call's decode step (every sequence the same new tokens): new pages, tables
    and lengths on every call (the page pool keeps its size, so the signature holds)."""
    for _ in range(CALLS):
        check_serving(*serving_step(dtype, new_tokens), dtype)
    assert plan_runs == [True] * (CALLS - 1)


@pytest.mark.parametrize("xpu_path", [False, True])
def test_serving_step_of_other_lengths_takes_the_general_path(xpu_path, monkeypatch,
                                                             plan_runs):
    """A planned decode step's signature with sequences of unequal new tokens (the last one
    fewer, q's last row belonging to none) is not run by the plan (C++ checks cu_seqlens_q;
    on the XPU path, one read of the device per step checks it with the cache's values), and
    the general path serves it."""
    reads = C.cache_value_reads()
    for call in range(CALLS):
        if xpu_path and call == 1:  # (the queue-handle seam, as test_xpu_path_through_...)
            handle = C.cpu_queue_handle()
            monkeypatch.setattr(launch, "queue_handle", lambda device: handle)
            monkeypatch.setattr(launch_plans, "reads_host_memory", lambda device: False)
        lengths = [(3, int(n)) for n in torch.randint(257, 289, (5,))]
        q, k_pages, v_pages, table, cu_q, seqused, seqs = paged_batch(lengths, 8, 2, 64, 32,
                                                                      torch.float32)
        seqs = list(seqs)
        if call == CALLS - 1:
            cu_q = cu_q.clone()
            cu_q[-1] -= 1
            q_b, k_b, v_b = seqs[-1]
            seqs[-1] = (q_b[:2], k_b, v_b)
        out = ipex_flash.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, None, 3, 400,
                                                causal=True, block_table=table, seqused_k=seqused)
        check_serving(out, cu_q, seqs, None, torch.float32)
    assert plan_runs == [True] * (CALLS - 2) + [False]
    assert C.cache_value_reads() - reads == (CALLS - 1 if xpu_path else 0)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_serving_decode_repeats(fp8, plan_runs):
    """The serving call's decode step over an FP8 page pool with one descale per tensor."""
    for _ in range(CALLS):
        lengths = [(1, int(n)) for n in torch.randint(257, 289, (5,))]
        q, k_pages, v_pages, table, cu_q, seqused, _ = paged_batch(lengths, 8, 2, 64, 32,
                                                                   torch.bfloat16)
        descales = [torch.rand(()) + 0.25 for _ in range(2)]
        pages = [(p.float() / d).to(fp8) for p, d in zip((k_pages, v_pages), descales)]
        out = ipex_flash.flash_attn_varlen_func(
            q, *pages, cu_q, None, 1, 400, causal=True, block_table=table, seqused_k=seqused,
            k_descale=descales[0], v_descale=descales[1])
        for b, (_, n_k) in enumerate(lengths):
            keys, values = (sequence_rows(p.double() * float(d), table, b, slice(0, n_k))
                            for p, d in zip(pages, descales))
            ref, _ = flash_attn_reference(q[b:b + 1, None], keys[None], values[None], causal=True)
            check(out[b:b + 1], ref[0], torch.bfloat16)
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


def test_xpu_path_through_a_queue_handle(monkeypatch, plan_runs):
    """The path XPU tensors take, on the CPU device: launches on a queue given by handle (as
    torch's XPU stream gives it), with scratch from that queue's pool, and the cache's values
    and packed sequences' offsets read from the device rather than by C++. (The host still
    waits for work on the CPU device, whose tensors torch frees as soon as a call returns.) The
    plans are built by a first call on the CPU device's default queue."""
    dtype = torch.bfloat16
    q = torch.randn(2, 8, 1, 64, dtype=dtype)
    kv = [torch.randn(2, 2, 90, 64, dtype=dtype) for _ in range(2)]
    ipex_flash.scaled_dot_product_attention(q, *kv, enable_gqa=True)
    k_cache, v_cache = make_cache(2, 96, 2, 64, dtype)
    k_pages, v_pages, table = to_paged(k_cache, v_cache, 32)

    def decode_step(lengths):  # a step of flash_attn_with_kvcache appending one token
        q, k, v = (torch.randn(2, 1, heads, 64, dtype=dtype) for heads in (8, 2, 2))
        expected = [after_append(c, table, lengths, n) for c, n in ((k_pages, k), (v_pages, v))]
        out = ipex_flash.flash_attn_with_kvcache(q, k_pages, v_pages, k, v, cache_seqlens=lengths,
                                                 block_table=table)
        assert torch.equal(k_pages, expected[0]) and torch.equal(v_pages, expected[1])
        ref = torch.cat([flash_attn_reference(
            q[b:b + 1], *(sequence_rows(c, table, b, slice(0, n + 1))[None]
                          for c in (k_pages, v_pages)))[0]
            for b, n in enumerate(lengths.tolist())])
        return out, ref

    def varlen_step(lengths_k):  # flash_attn_varlen_func, one query per sequence
        q = torch.randn(2, 8, 64, dtype=dtype)
        k, v = (torch.randn(100, 2, 64, dtype=dtype) for _ in range(2))
        cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
        cu_k = torch.tensor([0, lengths_k[0], sum(lengths_k)], dtype=torch.int32)
        out = ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, 60)
        ref = torch.cat([flash_attn_reference(q[None, b:b + 1], k[None, cu_k[b]:cu_k[b + 1]],
                                              v[None, cu_k[b]:cu_k[b + 1]])[0][0]
                         for b in range(2)])
        return out, ref

    decode_step(torch.tensor([50, 90], dtype=torch.int32))
    serving_step(dtype, 1)
    varlen_step((40, 60))

    handle = C.cpu_queue_handle()
    monkeypatch.setattr(launch, "queue_handle", lambda device: handle)
    monkeypatch.setattr(launch_plans, "reads_host_memory", lambda device: False)
    outputs = []
    for step in range(2):
        q = torch.randn(2, 8, 1, 64, dtype=dtype)
        kv = [torch.randn(2, 2, 90, 64, dtype=dtype) for _ in range(2)]
        outputs.append((ipex_flash.scaled_dot_product_attention(q, *kv, enable_gqa=True),
                        sdpa_reference(q, *kv)))
        outputs.append(decode_step(torch.tensor([51 + step, 91 + step], dtype=torch.int32)))
        outputs.append(serving_step(dtype, 1))
        outputs.append(varlen_step((30 + step, 55)))
    assert plan_runs == [True] * 8
    for item in outputs:
        if len(item) == 2:  # (out, reference)
            check(*item, dtype)
        else:
            check_serving(*item, dtype)


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
