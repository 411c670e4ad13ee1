"""Launch plans of the serving call's decode steps (flash_attn_varlen_func over a paged cache;
ipex_flash/kvcache/fast_calls.py), repeated with new data, lengths and pages each call against
the float64 reference, over FP8 page pools too, and a step of other lengths left to the
general path; and the XPU path (a queue by handle, the cache's values read from the device) of
the planned calls through a queue-handle seam on the CPU device."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.ops import launch, launch_plans
from ipex_flash.reference import flash_attn_reference, sdpa_reference

from helpers.cache_checks import after_append, check, sequence_rows
from helpers.caches import make_cache, paged_batch, to_paged
from helpers.cases import DTYPES, PLAN_CALLS as CALLS


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
