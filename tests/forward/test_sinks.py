"""Attention sinks (GPT-OSS) through flash-attn's functions: fixed length, packed (varlen) and
KV-cache decoding, forward and gradients (the sinks' own included), against float64."""
import pytest
import torch

import ipex_flash
from ipex_flash.reference import sdpa_reference

from helpers.reference import OUTPUT_TOLERANCE


def flash_layout(*shape_heads, dtype):
    return torch.randn(*shape_heads, dtype=dtype)


def reference(q, k, v, sinks, causal=False):
    """flash layout (B, N, H, D) in and out; causal only with Nq == Nk (both alignments agree)."""
    out = sdpa_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         is_causal=causal, sinks=sinks)
    return out.transpose(1, 2)


def check(out, ref, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("len_q", [1, 4, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_flash_attn_func_sinks_forward(dtype, len_q):
    """len_q 1 and 4 (x 4 heads per K/V head) take the decode kernel, 70 the general one."""
    q = flash_layout(2, len_q, 8, 64, dtype=dtype)
    k, v = flash_layout(2, 90, 2, 64, dtype=dtype), flash_layout(2, 90, 2, 64, dtype=dtype)
    sinks = torch.randn(8) * 3
    out = ipex_flash.flash_attn_func(q, k, v, sinks=sinks)
    check(out, reference(q, k, v, sinks), dtype)


def test_flash_attn_func_sink_gradients():
    q, k, v = (flash_layout(2, 60, h, 32, dtype=torch.float32) for h in (4, 2, 2))
    sinks = torch.randn(4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    ipex_flash.flash_attn_func(*leaves[:3], causal=True, sinks=leaves[3]).sum().backward()
    ref = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    reference(*ref, causal=True).sum().backward()
    for got, want in zip(leaves, ref):
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=1e-5, atol=1e-5)


def test_varlen_sinks_forward_and_gradient():
    lengths = [37, 80, 5]
    cu = torch.tensor([0, 37, 117, 122], dtype=torch.int32)
    total = 122 + 6  # rows past the last sequence belong to none
    q, k, v = (torch.randn(total, h, 32) for h in (4, 2, 2))
    sinks = torch.randn(4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out = ipex_flash.flash_attn_varlen_func(*leaves[:3], cu, cu, max(lengths), max(lengths),
                                            sinks=leaves[3])
    out[:122].sum().backward()
    ref_sinks = sinks.double().requires_grad_()
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        want = reference(*(t[start:end].unsqueeze(0).double() for t in (q, k, v)), ref_sinks)
        check(out[start:end].detach().unsqueeze(0), want, torch.float32)
        want.sum().backward()
    torch.testing.assert_close(leaves[3].grad.double(), ref_sinks.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("len_q", [1, 20, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kvcache_sinks(dtype, len_q):
    """One new token (decode kernel, split keys merged with the sink), 20 (decode slices: 80
    rows on each of two K/V heads) and 40 (general kernel)."""
    q = flash_layout(2, len_q, 8, 64, dtype=dtype)
    k_cache, v_cache = (flash_layout(2, 600, 2, 64, dtype=dtype) for _ in range(2))
    sinks = torch.randn(8) * 2
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=517, sinks=sinks)
    check(out, reference(q, k_cache[:, :517], v_cache[:, :517], sinks), dtype)
