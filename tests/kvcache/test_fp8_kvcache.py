"""FP8 KV caches (float8_e4m3fn, float8_e5m2) with k_descale / v_descale: the kernels'
dequantisation of every bit pattern, attention against a float64 reference of the dequantised
cache (decode and general kernels, contiguous and paged, the serving call), quantising
appends, and bad input."""
import pytest
import torch

import ipex_flash
from ipex_flash.ops import launch
from ipex_flash._runtime import C
from ipex_flash.reference import flash_attn_reference

from helpers.caches import to_paged
from helpers.fp8 import FP8, QUERY_DTYPES, check, check_cache_attention, quantised_cache
from helpers.reference import OUTPUT_TOLERANCE


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
@pytest.mark.parametrize("seqlen_q", [1, 77])  # the decode kernel; the general kernel
def test_every_bit_pattern_dequantises_exactly(fp8, dtype, seqlen_q):
    """One key whose value row holds all 256 FP8 bit patterns: the output is that row, each
    value exact in float16 and bfloat16 (NaN patterns give NaN)."""
    head_dim = 256
    v_cache = torch.arange(256, dtype=torch.uint8).view(fp8).reshape(1, 1, 1, head_dim)
    k_cache = torch.zeros(1, 1, 1, head_dim).to(fp8)
    q = torch.randn(1, seqlen_q, 1, head_dim, dtype=dtype)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache)
    expected = v_cache.float().to(dtype).expand(1, seqlen_q, 1, head_dim)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


# GPUs whose FP8 decode is the decode kernel (large register files: DeviceLimits::fp8_decode), whose
# conversion of a word keeps a compare per element for e4m3's NaN where the CPU device's
# carries it into the exponent (dtypes.hpp): run here with the GPU's profile.
FP8_DECODE_GPUS = [name for name in C.profile_names() if C.profile_limits(name)["fp8_decode"]]


@pytest.mark.parametrize("profile", FP8_DECODE_GPUS)
@pytest.mark.parametrize("fp8", FP8)
def test_every_bit_pattern_on_gpu_profiles(profile, fp8):
    """The same as above with each such GPU's kernel variant (its word conversion)."""
    head_dim = 256
    v_cache = torch.arange(256, dtype=torch.uint8).view(fp8).reshape(1, 1, 1, head_dim)
    k_cache = torch.zeros(1, 1, 1, head_dim).to(fp8)
    q = torch.randn(1, 1, 1, head_dim, dtype=torch.bfloat16)
    C.set_device_profile(profile)
    try:
        views = (launch.view(t.transpose(1, 2)) for t in (q, k_cache, v_cache))
        assert C.flash_decode_supported(*views, launch.queue_handle(q.device))
        out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache)
    finally:
        C.set_device_profile("")
    expected = v_cache.float().to(torch.bfloat16)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
@pytest.mark.parametrize("seqlen_q,heads", [(1, (8, 2)), (3, (4, 4)), (70, (6, 2))])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_matches_reference_of_dequantised_cache(fp8, dtype, seqlen_q, heads, per_head, paged):
    check_cache_attention(fp8, dtype, seqlen_q, heads, per_head, paged)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("head_dim", [64, 100, 20])  # 20: below the decode kernel's load width
def test_head_dims_windows_and_softcap(fp8, head_dim):
    batch, heads_kv, capacity, dtype = 2, 2, 200, torch.bfloat16
    (k_cache, v_cache), (k_descale, v_descale), (k64, v64) = quantised_cache(
        batch, capacity, heads_kv, head_dim, fp8, True)
    q = torch.randn(batch, 2, 4, head_dim, dtype=dtype)
    lengths = [200, 31]
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        window_size=(40, 0), softcap=5.0, k_descale=k_descale, v_descale=v_descale)
    check(out, q, k64, v64, lengths, dtype, window_size=(40, 0), softcap=5.0)


@pytest.mark.parametrize("fp8", FP8)
def test_append_quantises_with_saturation(fp8):
    batch, heads_kv, head_dim, dtype = 2, 2, 64, torch.bfloat16
    k_cache = torch.zeros(batch, 40, heads_kv, head_dim).to(fp8)
    v_cache = torch.zeros_like(k_cache)
    k_descale, v_descale = torch.tensor([[0.5, 2.0], [1.0, 0.25]]), torch.tensor(0.125)
    limit = torch.finfo(fp8).max
    k_new = torch.randn(batch, 3, heads_kv, head_dim, dtype=dtype)
    k_new[0, 0, 0, :4] = torch.tensor([1e6, -1e6, limit, float("inf")])  # saturate
    v_new = torch.randn(batch, 3, heads_kv, head_dim, dtype=dtype)
    k_before, v_before = k_new.clone(), v_new.clone()
    seqlens = torch.tensor([5, 20], dtype=torch.int32)
    q = torch.randn(batch, 1, 4, head_dim, dtype=dtype)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                             cache_seqlens=seqlens, k_descale=k_descale,
                                             v_descale=v_descale)
    assert torch.equal(k_new, k_before) and torch.equal(v_new, v_before)
    for b, start in enumerate(seqlens.tolist()):
        k_expected = (k_new[b].double() / k_descale[b][None, :, None].double()).clamp(-limit, limit)
        v_expected = (v_new[b].double() / 0.125).clamp(-limit, limit)
        assert torch.equal(k_cache[b, start:start + 3].view(torch.uint8),
                           k_expected.to(fp8).view(torch.uint8))
        assert torch.equal(v_cache[b, start:start + 3].view(torch.uint8),
                           v_expected.to(fp8).view(torch.uint8))
        assert not k_cache[b, :start].float().any() and not k_cache[b, start + 3:].float().any()
    assert k_cache[0, 5, 0, :4].float().tolist() == [limit, -limit, limit, limit]
    k64 = k_cache.double() * k_descale[:, None, :, None].double()
    v64 = v_cache.double() * 0.125
    check(out, q, k64, v64, (seqlens + 3).tolist(), dtype)


@pytest.mark.parametrize("fp8", FP8)
def test_serving_call_mixes_decodes_and_prefills(fp8):
    """flash_attn_varlen_func over a paged FP8 cache: two decodes and a chunked prefill."""
    heads_q, heads_kv, head_dim, dtype = 8, 2, 128, torch.float16
    lengths_q, lengths_k = [1, 37, 1], [300, 100, 5]
    (k_cache, v_cache), (k_descale, v_descale), (k64, v64) = quantised_cache(
        3, 320, heads_kv, head_dim, fp8, True)
    k_pages, v_pages, table = to_paged(k_cache, v_cache, 32)
    cu_q = torch.tensor([0, 1, 38, 39], dtype=torch.int32)
    q = torch.randn(39, heads_q, head_dim, dtype=dtype)
    out = ipex_flash.flash_attn_varlen_func(
        q, k_pages, v_pages, cu_q, None, 37, 300, causal=True, block_table=table,
        seqused_k=torch.tensor(lengths_k, dtype=torch.int32), k_descale=k_descale,
        v_descale=v_descale)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for b in range(3):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref, _ = flash_attn_reference(q[rows][None], k64[b:b + 1, :lengths_k[b]],
                                      v64[b:b + 1, :lengths_k[b]], causal=True)
        torch.testing.assert_close(out[rows].double(), ref[0], rtol=rtol, atol=atol)


def _fp8_args(**change):
    args = dict(q=torch.randn(2, 1, 4, 64, dtype=torch.bfloat16),
                k_cache=torch.zeros(2, 16, 2, 64).to(torch.float8_e4m3fn),
                v_cache=torch.zeros(2, 16, 2, 64).to(torch.float8_e4m3fn))
    args.update(change)
    return args


@pytest.mark.parametrize("change,error,match", [
    (dict(q=torch.randn(2, 1, 4, 64)), TypeError, "q must be torch.float16 or torch.bfloat16"),
    (dict(v_cache=torch.zeros(2, 16, 2, 64).to(torch.float8_e5m2)), TypeError,
     "k_cache .* and v_cache .* must have one dtype"),
    (dict(k_descale=torch.ones(2)), ValueError, r"k_descale must hold one value .* \(2, 2\)"),
    (dict(v_descale=torch.ones(2, 2, dtype=torch.int32)), TypeError,
     "v_descale must be a floating-point tensor"),
    (dict(k=torch.randn(2, 1, 2, 64), v=torch.randn(2, 1, 2, 64)), TypeError,
     r"k.dtype \(torch.float32\) must equal the cache's .* or q's"),
])
def test_bad_input(change, error, match):
    args = _fp8_args(**change)
    k_cache_before = args["k_cache"].clone()
    with pytest.raises(error, match=match):
        ipex_flash.flash_attn_with_kvcache(**args)
    assert torch.equal(args["k_cache"].view(torch.uint8), k_cache_before.view(torch.uint8))


@pytest.mark.parametrize("paged", [False, True])
def test_descales_on_a_16bit_cache_are_applied(paged):
    """With a 16-bit cache the descales scale what is read (q . k * k_descale, v * v_descale),
    in flash_attn_with_kvcache as in the serving call (vLLM passes them on every call)."""
    k_cache, v_cache = (torch.randn(2, 32, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(2, 3, 4, 64, dtype=torch.bfloat16)
    k_descale, v_descale = torch.tensor([[0.5, 2.0], [1.0, 0.25]]), torch.tensor(3.0)
    table = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)[:, :1] if paged else None
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20, causal=True,
                                             block_table=table, k_descale=k_descale,
                                             v_descale=v_descale)
    for b in range(2):
        row = int(table[b, 0]) if paged else b
        k64 = k_cache[row, :20].double() * k_descale[b][None, :, None]
        ref, _ = flash_attn_reference(q[b:b + 1], k64[None], v_cache[row:row + 1, :20].double() * 3.0,
                                      causal=True)
        torch.testing.assert_close(out[b:b + 1].double(), ref, rtol=1e-2, atol=1e-2)


def test_no_backward_through_fp8():
    """The kernels' FP8 path is inference only: the backward refuses FP8 keys."""
    q = torch.randn(1, 2, 3, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 3, 64).to(torch.float8_e4m3fn)
    with pytest.raises((TypeError, ValueError), match="k has dtype torch.float8_e4m3fn"):
        torch.ops.ipex_flash.attention(q, k, k, False, None, 0.0, False)


def test_append_op_alone_takes_descales_in_any_accepted_form():
    """ipex_flash::kvcache_append called directly: default descales are 1, one value is
    broadcast, as flash_attn_with_kvcache normalises them."""
    k_new = torch.randn(2, 1, 2, 16, dtype=torch.bfloat16) * 100
    for k_descale, scale in ((None, 1.0), (torch.tensor(4.0), 4.0)):
        k_cache = torch.zeros(2, 4, 2, 16).to(torch.float8_e5m2)
        v_cache = torch.zeros_like(k_cache)
        torch.ops.ipex_flash.kvcache_append(k_cache, v_cache, k_new, k_new,
                                            torch.tensor([0, 2], dtype=torch.int32), None,
                                            k_descale, None)
        assert torch.equal(k_cache[0, 0].view(torch.uint8),
                           (k_new[0, 0].double() / scale).to(torch.float8_e5m2).view(torch.uint8))
        assert torch.equal(v_cache[1, 2].view(torch.uint8),
                           k_new[1, 0].double().to(torch.float8_e5m2).view(torch.uint8))
