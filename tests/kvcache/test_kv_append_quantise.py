"""A decode step's launch plan appends 16-bit keys and values into an FP8 cache through the
kv_append kernel, which quantises them on the device (sycl_src/device/fp8_encode.hpp): the
bytes it stores are torch's (x / descale).clamp(-max, max).to(float8) for every bfloat16 and
float16 bit pattern (subnormals, infinities and NaN included), and the attention then reads
them."""
import pytest
import torch

import ipex_flash
from ipex_flash.reference import flash_attn_reference

from helpers.caches import to_paged
from helpers.cases import PLAN_CALLS
from helpers.reference import OUTPUT_TOLERANCE

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def expected_bytes(new, descale, fp8):
    """torch's quantisation of new (B, Nnew, Hkv, D) by descale (B, Hkv)."""
    limit = torch.finfo(fp8).max
    return (new.float() / descale[:, None, :, None]).clamp(-limit, limit).to(fp8)


def assert_same_fp8(got, want):
    """Equal bytes, NaN for NaN (its sign and payload are the format's choice)."""
    nan = want.float().isnan()
    assert torch.equal(got.float().isnan(), nan)
    assert torch.equal(got.view(torch.uint8)[~nan], want.view(torch.uint8)[~nan])


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_bit_pattern(fp8, dtype, plan_runs):
    """All 65536 patterns of the 16-bit dtype appended as one step's keys (values: the same,
    reversed), with descales of 1 and others, by the plan of a signature seen once before."""
    batch, new_tokens, heads_kv, head_dim, capacity = 8, 16, 4, 128, 40
    patterns = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    k_new = patterns.view(batch, new_tokens, heads_kv, head_dim)
    v_new = patterns.flip(0).view(batch, new_tokens, heads_kv, head_dim)
    for call in range(PLAN_CALLS):
        descales = [torch.rand(batch, heads_kv) * 4 + 0.01 for _ in range(2)]
        descales[0][::2] = 1.0  # (exact division)
        k_cache, v_cache = (torch.zeros(batch, capacity, heads_kv, head_dim, dtype=fp8)
                            for _ in range(2))
        lengths = torch.randint(0, capacity - new_tokens + 1, (batch,), dtype=torch.int32)
        q = torch.randn(batch, 1, heads_kv, head_dim, dtype=dtype)
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                           cache_seqlens=lengths, k_descale=descales[0],
                                           v_descale=descales[1])
        for cache, new, descale in ((k_cache, k_new, descales[0]), (v_cache, v_new, descales[1])):
            want = expected_bytes(new, descale, fp8)
            rows = lengths.long()[:, None] + torch.arange(new_tokens)
            assert_same_fp8(cache[torch.arange(batch)[:, None], rows], want)
    assert plan_runs == [True] * (PLAN_CALLS - 1)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("paged", [False, True])
def test_decode_steps_append_and_attend(fp8, paged, plan_runs):
    """A model's decode step over an FP8 cache, bfloat16 tokens appended each call with one
    descale per tensor: the attention against float64 over the dequantised cache."""
    batch, capacity, dtype = 3, 96, torch.bfloat16
    descales = (torch.tensor(0.7), torch.tensor(1.3))
    k_cache, v_cache = ((torch.randn(batch, capacity, 2, 64) / d).to(fp8) for d in descales)
    table = None
    if paged:
        k_cache, v_cache, table = to_paged(k_cache, v_cache, 32)
    lengths = torch.randint(1, capacity - PLAN_CALLS, (batch,), dtype=torch.int32)
    for step in range(PLAN_CALLS):
        q = torch.randn(batch, 1, 8, 64, dtype=dtype)
        k_new, v_new = (torch.randn(batch, 1, 2, 64, dtype=dtype) for _ in range(2))
        out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                 cache_seqlens=lengths, block_table=table,
                                                 k_descale=descales[0], v_descale=descales[1])
        for b in range(batch):
            rows = torch.arange(int(lengths[b]) + 1)
            keys, values = (
                (c[b, rows] if table is None else c[table[b].long()].flatten(0, 1)[rows]).double()
                * float(d) for c, d in ((k_cache, descales[0]), (v_cache, descales[1])))
            want = expected_bytes(k_new[b:b + 1], descales[0].expand(1, 2), fp8)
            assert_same_fp8((keys[-1:] / float(descales[0])).to(fp8)[None], want)
            ref, _ = flash_attn_reference(q[b:b + 1], keys[None], values[None])
            rtol, atol = OUTPUT_TOLERANCE[dtype]
            torch.testing.assert_close(out[b:b + 1].double(), ref, rtol=rtol, atol=atol)
        lengths = lengths + 1
    assert plan_runs == [True] * (PLAN_CALLS - 1)
