"""FP8 KV caches (float8_e4m3fn, float8_e5m2) with their k_descale / v_descale, the float64
caches they dequantise to, and attention over them against the reference. Shared by
kvcache/test_fp8_kvcache.py, kvcache/test_kvcache_leftpad.py, kvcache/test_kvcache_call_plans.py
and matrix/test_fp8_matrix.py."""
import ipex_flash
import torch
from ipex_flash.reference import flash_attn_reference

from helpers.caches import to_paged
from helpers.reference import OUTPUT_TOLERANCE

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
QUERY_DTYPES = [torch.float16, torch.bfloat16]


def quantised_cache(batch, capacity, heads_kv, head_dim, fp8, per_head):
    """k, v caches in fp8 with their descales (one value, or (batch, heads_kv)), and the
    dequantised float64 caches the reference reads."""
    shape = (batch, 1) if not per_head else (batch, heads_kv)
    caches, descales, exact = [], [], []
    for _ in range(2):
        descale = (torch.rand(shape) + 0.25) if per_head else torch.rand(()) + 0.25
        full = torch.randn(batch, capacity, heads_kv, head_dim)
        scale = descale.reshape(-1, 1, shape[1], 1) if per_head else descale
        cache = (full / scale).to(fp8)
        caches.append(cache)
        descales.append(descale)
        exact.append(cache.double() * (scale.double() if per_head else float(descale)))
    return caches, descales, exact


def check(out, q, k64, v64, lengths, dtype, **options):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    assert out.dtype == dtype
    for b, length in enumerate(lengths):
        ref, _ = flash_attn_reference(q[b:b + 1], k64[b:b + 1, :length], v64[b:b + 1, :length],
                                      **options)
        torch.testing.assert_close(out[b:b + 1].double(), ref, rtol=rtol, atol=atol)


def check_cache_attention(fp8, dtype, seqlen_q, heads, per_head, paged):
    """flash_attn_with_kvcache, causal, over a quantised cache of three sequences (300, 129
    and 77 keys, head dim 128), against the float64 reference of the dequantised cache."""
    heads_q, heads_kv = heads
    batch, capacity, head_dim = 3, 300, 128
    (k_cache, v_cache), (k_descale, v_descale), (k64, v64) = quantised_cache(
        batch, capacity, heads_kv, head_dim, fp8, per_head)
    lengths = [300, 129, 77]
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype)
    block_table = None
    if paged:
        k_cache, v_cache, block_table = to_paged(k_cache, v_cache, 64)
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        block_table=block_table, causal=True, k_descale=k_descale, v_descale=v_descale)
    check(out, q, k64, v64, lengths, dtype, causal=True)
