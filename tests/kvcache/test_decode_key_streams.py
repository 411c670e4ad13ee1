"""The decode kernel's key streams on the CPU device (decode_streams.hpp): with at most 4 query
rows per K/V head and a cache whose key rows hold the heads side by side ((B, N, H, D) and
paged caches), a step's keys come from KEYS_PER_STEP runs of the split's keys and P.V goes
step by step. Every case checks which order the kernel takes, then compares with the float64
reference: lengths that leave the last stream partly or wholly past the split's end (and
sequences of 1 and 5 keys), several splits, causal windows that move the first key,
softcap, ALiBi, sinks, paged and FP8 caches, a value head dim of its own and padded head
dims; (B, H, N, D) caches and 8-row groups keep the consecutive order."""
import pytest
import torch

import ipex_flash
from ipex_flash.ops import launch
from ipex_flash._runtime import C
from ipex_flash.reference import flash_attn_reference

from helpers.caches import cache_in_layout, make_cache, to_paged
from helpers.cases import DTYPES
from helpers.reference import (OUTPUT_TOLERANCE, check_against_reference,
                               check_sinks_against_reference)


def decode_order(q, k_cache, v_cache):
    """"streams", "consecutive" or "matrix" (scores on a matrix engine, head by head): the
    order the decode kernel takes for flash_attn_with_kvcache's q (B, Nq, Hq, D) and cache."""
    views = [launch.view(t.transpose(1, 2)) for t in (q, k_cache, v_cache)]
    assert C.flash_decode_supported(*views, launch.queue_handle(q.device))
    variant = C.flash_decode_variant(*views, launch.queue_handle(q.device))
    if variant.matrix_m > 0:
        assert not variant.features & C.FEATURE_KEY_STREAMS
        return "matrix"
    return "streams" if variant.features & C.FEATURE_KEY_STREAMS else "consecutive"


def assert_order(q, k_cache, v_cache, expected):
    order = decode_order(q, k_cache, v_cache)
    assert order in (expected, "matrix"), order


# (heads_q, heads_kv, new tokens, head_dim): 4, 2 and 1 rows per K/V head (4, 8 and 16 keys
# per step), two tokens of a GQA pair, a padded head dim.
SHAPES = [(8, 2, 1, 64), (6, 3, 1, 128), (4, 4, 1, 64), (4, 2, 2, 64), (8, 2, 1, 80)]


@pytest.mark.parametrize("heads_q,heads_kv,new_tokens,head_dim", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_streams_match_reference(dtype, heads_q, heads_kv, new_tokens, head_dim):
    lengths = [1000, 37, 1, 5, 611]  # several splits; streams partly or wholly past the end
    k_cache, v_cache = make_cache(len(lengths), 1003, heads_kv, head_dim, dtype)
    q = torch.randn(len(lengths), new_tokens, heads_q, head_dim, dtype=dtype)
    assert_order(q, k_cache, v_cache, "streams")
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        causal=True, return_softmax_lse=True)
    check_against_reference(out, lse, q, k_cache, v_cache, lengths, dtype, causal=True)


# (causal, window, softcap, alibi)
OPTIONS = [(True, (100, 0), 0.0, False), (True, (37, 0), 5.0, True), (False, (-1, -1), 3.0, True),
           (False, (300, 200), 0.0, False)]


@pytest.mark.parametrize("causal,window,softcap,alibi", OPTIONS)
@pytest.mark.parametrize("page_size", [None, 16, 48, 512])
def test_streams_with_score_changes_and_pages(causal, window, softcap, alibi, page_size):
    """Windows move the split's first key off a block boundary; pages put a stream's keys in
    pages of their own."""
    batch, heads_q, heads_kv, new_tokens, head_dim = 2, 4, 2, 2, 64  # 4 rows per K/V head
    lengths = [900, 260]
    k_cache, v_cache = make_cache(batch, 912, heads_kv, head_dim, torch.float32)
    q = torch.randn(batch, new_tokens, heads_q, head_dim)
    slopes = torch.rand(batch, heads_q) * 0.3 if alibi else None
    assert_order(q, k_cache, v_cache, "streams")
    kwargs, k_in, v_in = {}, k_cache, v_cache
    if page_size is not None:
        k_in, v_in, table = to_paged(k_cache, v_cache, page_size)
        kwargs = dict(block_table=table)
        assert_order(q, k_in, v_in, "streams")
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_in, v_in, cache_seqlens=torch.tensor(lengths, dtype=torch.int32), causal=causal,
        window_size=window, softcap=softcap, alibi_slopes=slopes, return_softmax_lse=True,
        **kwargs)
    check_against_reference(out, lse, q, k_cache, v_cache, lengths, torch.float32, causal=causal,
                            window_size=window, softcap=softcap, alibi_slopes=slopes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streams_with_sinks(dtype):
    q = torch.randn(3, 1, 16, 64, dtype=dtype)
    k_cache, v_cache = make_cache(3, 700, 4, 64, dtype)
    lengths = [700, 333, 2]
    sinks = torch.randn(16) * 2
    assert_order(q, k_cache, v_cache, "streams")
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32), sinks=sinks)
    check_sinks_against_reference(out, q, k_cache, v_cache, lengths, sinks, dtype)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_streams_fp8_cache_and_value_head_dim(fp8):
    """An FP8 cache (always the vector scores) with per-(batch, head) descales, v's head dim 64
    under q's 128."""
    batch, heads_q, heads_kv, lengths = 2, 16, 4, [1000, 129]
    k_full, v_full = torch.randn(batch, 1024, heads_kv, 128), torch.randn(batch, 1024, heads_kv, 64)
    k_descale, v_descale = torch.rand(batch, heads_kv) + 0.5, torch.rand(batch, heads_kv) + 0.5
    k_cache = (k_full / k_descale[:, None, :, None]).to(fp8)
    v_cache = (v_full / v_descale[:, None, :, None]).to(fp8)
    k64 = k_cache.double() * k_descale[:, None, :, None].double()
    v64 = v_cache.double() * v_descale[:, None, :, None].double()
    q = torch.randn(batch, 1, heads_q, 128, dtype=torch.bfloat16)
    assert decode_order(q, k_cache, v_cache) == "streams"
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        k_descale=k_descale, v_descale=v_descale)
    rtol, atol = OUTPUT_TOLERANCE[torch.bfloat16]
    for b, length in enumerate(lengths):
        ref, _ = flash_attn_reference(q[b:b + 1], k64[b:b + 1, :length], v64[b:b + 1, :length])
        torch.testing.assert_close(out[b:b + 1].double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["head_major", "eight_rows", "one_kv_head"])
def test_consecutive_order_where_streams_lose(dtype, case):
    """(B, H, N, D) caches (each head's keys contiguous), 8 rows per K/V head and a single
    K/V head keep the consecutive order, with the same answer."""
    heads_q, heads_kv, layout = {"head_major": (8, 2, "head_major"),
                                 "eight_rows": (16, 2, "contiguous"),
                                 "one_kv_head": (4, 1, "contiguous")}[case]
    lengths = [800, 41]
    k_cache, v_cache = cache_in_layout(layout, len(lengths), 800, heads_kv, 64, dtype)
    q = torch.randn(len(lengths), 1, heads_q, 64, dtype=dtype)
    assert_order(q, k_cache, v_cache, "consecutive")
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        return_softmax_lse=True)
    check_against_reference(out, lse, q, k_cache, v_cache, lengths, dtype)
