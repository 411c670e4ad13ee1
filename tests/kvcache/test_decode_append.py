"""flash_attn_with_kvcache's append inside the decode kernel (sycl_src/device/decode_append.hpp):
a decode step's plan whose query rows per K/V head fit one work-group appends its new keys and
values in the attention's own launch, the work-group of each new key's split writing it. New
tokens straddling split boundaries (num_splits forced), contiguous, paged and left-padded
caches, every dtype, rotary, FP8 caches, against the float64 reference; past one work-group's
rows the append kernel runs first, with the same results."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash.ops import launch_plans
from ipex_flash.reference import flash_attn_reference

from helpers.cache_checks import after_append, check, check_cache_attention
from helpers.caches import make_cache, to_paged
from helpers.cases import DTYPES, PLAN_CALLS
from helpers.rotary import expected as rotary_expected, rotate64


@pytest.fixture
def fused_runs(plan_runs, monkeypatch):
    """Whether each planned run appended in the decode kernel."""
    fused, real = [], launch_plans.run
    monkeypatch.setattr(launch_plans, "run",
                        lambda plan, *a, **kw: fused.append(plan.appends_in_decode)
                        or real(plan, *a, **kw))
    return fused


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "paged", "leftpad"])
@pytest.mark.parametrize("heads_kv,new_tokens", [(2, 3), (4, 1), (1, 3)])
def test_appends_across_split_boundaries(dtype, layout, heads_kv, new_tokens, fused_runs):
    """8 query heads: 12 or 2 rows per K/V head append in the decode kernel, 24 (one K/V head,
    3 new tokens) through the append kernel. About 130 keys in 4 splits make splits of 48 or
    64 keys (multiples of the kernel's key block): the lengths put 3 new keys across each of
    their boundaries."""
    batch, capacity, head_dim = 4, 200, 64
    for call in range(PLAN_CALLS):
        k_cache, v_cache = make_cache(batch, capacity, heads_kv, head_dim, dtype)
        lengths = torch.tensor([46, 62, 94, 126 + call], dtype=torch.int32)
        q = torch.randn(batch, new_tokens, 8, head_dim, dtype=dtype)
        k_new, v_new = (torch.randn(batch, new_tokens, heads_kv, head_dim, dtype=dtype)
                        for _ in range(2))
        args = dict(cache_seqlens=lengths, causal=True, return_softmax_lse=True, num_splits=4)
        k_in, v_in, starts, table = k_cache, v_cache, torch.zeros(batch, dtype=torch.int32), None
        if layout == "paged":
            k_in, v_in, table = to_paged(k_cache, v_cache, 16)
            args["block_table"] = table
        if layout == "leftpad":
            starts = torch.tensor([0, 5, 40, 7], dtype=torch.int32)
            args["cache_leftpad"] = starts
        expected = [after_append(c, table, lengths, n) for c, n in ((k_in, k_new), (v_in, v_new))]
        out, lse = ipex_flash.flash_attn_with_kvcache(q, k_in, v_in, k_new, v_new, **args)
        assert torch.equal(k_in, expected[0]) and torch.equal(v_in, expected[1])
        check_cache_attention(out, lse, q, (k_in, v_in), table, starts, lengths + new_tokens,
                              dtype)
    rows_per_head = 8 // heads_kv * new_tokens
    assert fused_runs == [rows_per_head <= 16] * (PLAN_CALLS - 1)


@pytest.mark.parametrize("heads_kv,new_tokens", [(2, 3), (1, 3)])
@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_in_the_decode_kernel(heads_kv, new_tokens, interleaved, fused_runs):
    """The rotary embedding of the new keys and the queries (rotary_dim 32 of 64, float32
    tables) in the decode kernel's append; past one work-group's rows in the append kernel."""
    batch, capacity, head_dim = 2, 96, 64
    for _ in range(PLAN_CALLS):
        k_cache, v_cache = make_cache(batch, capacity, heads_kv, head_dim, torch.float32)
        before = k_cache.clone(), v_cache.clone()
        q = torch.randn(batch, new_tokens, 8, head_dim)
        k_new, v_new = (torch.randn(batch, new_tokens, heads_kv, head_dim) for _ in range(2))
        lengths = torch.randint(0, capacity - new_tokens + 1, (batch,), dtype=torch.int32)
        angles = torch.rand(capacity, 16, dtype=torch.float64) * 2 * math.pi
        cos, sin = angles.cos().float(), angles.sin().float()
        out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cos, sin,
                                                 lengths, causal=True,
                                                 rotary_interleaved=interleaved)
        used = torch.atan2(sin.double(), cos.double())
        want = rotary_expected(q, *before, k_new, v_new, lengths, [0, 1], True, used,
                               interleaved)
        check(out, want, torch.float32)
    assert fused_runs == [8 // heads_kv * new_tokens <= 16] * (PLAN_CALLS - 1)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_cache_appends_in_the_decode_kernel(fp8, fused_runs):
    """bfloat16 tokens into an FP8 cache: quantised in the decode kernel (the bytes of every
    bit pattern: test_kv_append_quantise.py), which then reads them back."""
    batch, capacity, heads_kv, head_dim = 2, 96, 2, 64
    descales = torch.rand(batch, heads_kv) + 0.5, torch.rand(batch, heads_kv) + 0.5
    for _ in range(PLAN_CALLS):
        k_cache, v_cache = (torch.zeros(batch, capacity, heads_kv, head_dim, dtype=fp8)
                            for _ in range(2))
        q = torch.randn(batch, 1, 8, head_dim, dtype=torch.bfloat16)
        k_new, v_new = (torch.randn(batch, 1, heads_kv, head_dim, dtype=torch.bfloat16)
                        for _ in range(2))
        lengths = torch.randint(0, capacity - 1, (batch,), dtype=torch.int32)
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                           cache_seqlens=lengths, k_descale=descales[0],
                                           v_descale=descales[1])
        for b in range(batch):
            for cache, new, descale in ((k_cache, k_new, descales[0]), (v_cache, v_new, descales[1])):
                want = (new[b, 0].float() / descale[b, :, None]).to(fp8)
                assert torch.equal(cache[b, int(lengths[b])].view(torch.uint8),
                                   want.view(torch.uint8))
    assert fused_runs == [True] * (PLAN_CALLS - 1)


def fp8_order(cache):
    """An FP8 tensor's bytes as integers in the order of the values (-0 and +0 both 0), so that
    neighbouring values differ by 1."""
    bits = cache.view(torch.uint8).int()
    return torch.where(bits >= 128, 128 - bits, bits)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("heads_kv", [2, 1])
def test_rotary_into_an_fp8_cache(fp8, heads_kv, fused_runs):
    """bfloat16 tokens rotated (all 64 features, float32 tables) and quantised into an FP8
    cache by the decode kernel, which rotates the queries too (12 rows per K/V head): each new
    key is the float64 rotation quantised, give or take the one FP8 step that rounding it to
    bfloat16 first may cost, each new value exact, and the attention that of the cache's
    bytes. 24 rows per K/V head keep the general path: the append kernel rotates only into
    16-bit and float32 caches."""
    batch, capacity, head_dim, new_tokens = 2, 96, 64, 3
    descales = torch.rand(batch, heads_kv) + 0.5, torch.rand(batch, heads_kv) + 0.5
    for _ in range(PLAN_CALLS):
        k_cache, v_cache = (torch.randn(batch, capacity, heads_kv, head_dim).to(fp8)
                            for _ in range(2))
        q = torch.randn(batch, new_tokens, 8, head_dim, dtype=torch.bfloat16)
        k_new, v_new = (torch.randn(batch, new_tokens, heads_kv, head_dim, dtype=torch.bfloat16)
                        for _ in range(2))
        lengths = torch.randint(0, capacity - new_tokens + 1, (batch,), dtype=torch.int32)
        angles = torch.rand(capacity, head_dim // 2, dtype=torch.float64) * 2 * math.pi
        cos, sin = angles.cos().float(), angles.sin().float()
        used = torch.atan2(sin.double(), cos.double())
        out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cos, sin,
                                                 lengths, causal=True, k_descale=descales[0],
                                                 v_descale=descales[1])
        for b in range(batch):
            start = int(lengths[b])
            positions = torch.arange(start, start + new_tokens)
            rotated = rotate64(k_new[b].double(), used[positions][:, None, :], True)
            scale_k, scale_v = (d[b].double()[None, :, None] for d in descales)
            want_k = (rotated / scale_k).to(fp8)
            got_k = k_cache[b, start:start + new_tokens]
            assert (fp8_order(got_k) - fp8_order(want_k)).abs().max() <= 1
            want_v = (v_new[b].float() / descales[1][b, :, None]).to(fp8)
            assert torch.equal(v_cache[b, start:start + new_tokens].view(torch.uint8),
                               want_v.view(torch.uint8))
            keys = k_cache[b, :start + new_tokens].double() * scale_k
            values = v_cache[b, :start + new_tokens].double() * scale_v
            q_b = rotate64(q[b].double(), used[positions][:, None, :], True)
            ref, _ = flash_attn_reference(q_b[None], keys[None], values[None], True)
            check(out[b:b + 1], ref, torch.bfloat16)
    assert fused_runs == [True] * (PLAN_CALLS - 1) if heads_kv == 2 else fused_runs == []


@pytest.mark.parametrize("heads_kv", [2, 1])
def test_rotary_plan_takes_one_query_from_head_major_memory(heads_kv, fused_runs):
    """One new token's queries made by transposing (B, Hq, 1, D) memory: torch calls them
    contiguous though their token stride is D, not Hq * D. The rotary plans take them (one
    launch, or the append kernel's rotated copy of them past one work-group's rows)."""
    batch, capacity, heads_q, head_dim = 2, 96, 8 if heads_kv == 2 else 32, 64
    for _ in range(PLAN_CALLS):
        k_cache, v_cache = make_cache(batch, capacity, heads_kv, head_dim, torch.float32)
        before = k_cache.clone(), v_cache.clone()
        q = torch.randn(batch, heads_q, 1, head_dim).transpose(1, 2).contiguous()
        assert q.stride(1) == head_dim  # (the layout under test)
        k_new, v_new = (torch.randn(batch, 1, heads_kv, head_dim) for _ in range(2))
        lengths = torch.randint(0, capacity - 1, (batch,), dtype=torch.int32)
        angles = torch.rand(capacity, head_dim // 2, dtype=torch.float64) * 2 * math.pi
        cos, sin = angles.cos().float(), angles.sin().float()
        out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cos, sin,
                                                 lengths, causal=True)
        used = torch.atan2(sin.double(), cos.double())
        check(out, rotary_expected(q, *before, k_new, v_new, lengths, [0, 1], True, used),
              torch.float32)
    assert fused_runs == [heads_q // heads_kv <= 16] * (PLAN_CALLS - 1)
