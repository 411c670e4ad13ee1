"""Decoding with more query rows per K/V head than one decode work-group holds (MQA, long GQA
groups, speculative drafts of a few tokens): the rows are cut into slices of MAX_DECODE_ROWS,
each work-group taking one slice (sycl_src/host/variants/decode_variant.cpp). Every case checks that the decode
kernel serves it, then compares with the float64 reference: full and partial last slices,
several K/V heads per work-group, per-head ALiBi slopes and sinks (the query head of a row in
a later slice), causal masks with several new tokens (the token of a row), softcap, windows,
paged and FP8 caches, a value head dim of its own, and the serving call."""
import pytest
import torch

import ipex_flash
from ipex_flash.ops import launch
from ipex_flash._runtime import C
from ipex_flash.reference import flash_attn_reference, sdpa_reference

from helpers.caches import make_cache, to_paged
from helpers.cases import DTYPES
from helpers.reference import OUTPUT_TOLERANCE, check_against_reference


def served_by_decode_kernel(q, k_cache, v_cache):
    """Whether flash_attn_with_kvcache's q (B, Nq, Hq, D) takes the decode kernel."""
    views = (launch.view(t.transpose(1, 2)) for t in (q, k_cache, v_cache))
    return C.flash_decode_supported(*views, launch.queue_handle(q.device))


# (heads_q, heads_kv, new tokens): rows per K/V head = heads_q / heads_kv * new tokens.
SHAPES = [(32, 1, 1),   # MQA: two full slices
          (48, 1, 1),   # three slices
          (40, 2, 1),   # 20 rows: a full slice and a slice of 4, two K/V heads
          (32, 8, 5),   # 20 rows of 5 tokens: a token's rows span the two slices
          (64, 4, 3),   # 48 rows, four K/V heads
          (12, 4, 16),  # 48 rows of 16 tokens (the most with four K/V heads)
          (24, 1, 13),  # MQA, 312 rows: 20 slices, the last of 8
          (10, 2, 32)]  # 160 rows of 32 tokens (the most with two K/V heads)


@pytest.mark.parametrize("heads_q,heads_kv,new_tokens", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sliced_rows_match_reference(dtype, heads_q, heads_kv, new_tokens):
    lengths = [300, 37]
    k_cache, v_cache = make_cache(len(lengths), 310, heads_kv, 64, dtype)
    q = torch.randn(len(lengths), new_tokens, heads_q, 64, dtype=dtype)
    assert heads_q // heads_kv * new_tokens > C.MAX_DECODE_ROWS
    assert served_by_decode_kernel(q, k_cache, v_cache)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    out, lse = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                  causal=True, return_softmax_lse=True)
    check_against_reference(out, lse, q, k_cache, v_cache, lengths, dtype, causal=True)


# (causal, window, softcap, alibi)
OPTIONS = [(False, (-1, -1), 0.0, True), (True, (60, 0), 4.0, True), (True, (-1, -1), 2.0, False)]


@pytest.mark.parametrize("causal,window,softcap,alibi", OPTIONS)
@pytest.mark.parametrize("paged", [False, True])
def test_sliced_rows_with_score_changes(causal, window, softcap, alibi, paged):
    """Per-head ALiBi slopes and the bottom-right causal window read each row's own query head
    and token."""
    batch, heads_q, heads_kv, new_tokens, head_dim = 2, 24, 2, 3, 128
    lengths = [200, 513]
    k_cache, v_cache = make_cache(batch, 520, heads_kv, head_dim, torch.float32)
    q = torch.randn(batch, new_tokens, heads_q, head_dim)
    slopes = torch.rand(batch, heads_q) * 0.3 if alibi else None
    kwargs = {}
    if paged:
        k_pages, v_pages, table = to_paged(k_cache, v_cache, 64)
        kwargs = dict(block_table=table)
    else:
        k_pages, v_pages = k_cache, v_cache
    assert served_by_decode_kernel(q, k_cache, v_cache)
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_pages, v_pages, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes,
        return_softmax_lse=True, **kwargs)
    check_against_reference(out, lse, q, k_cache, v_cache, lengths, torch.float32, causal=causal,
                            window_size=window, softcap=softcap, alibi_slopes=slopes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliced_rows_with_sinks(dtype):
    """MQA 32/1: the sink of each query head, in either slice."""
    q = torch.randn(2, 1, 32, 64, dtype=dtype)
    k_cache, v_cache = (torch.randn(2, 600, 1, 64, dtype=dtype) for _ in range(2))
    sinks = torch.randn(32) * 2
    assert served_by_decode_kernel(q, k_cache, v_cache)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=517, sinks=sinks)
    ref = sdpa_reference(q.transpose(1, 2), k_cache[:, :517].transpose(1, 2),
                         v_cache[:, :517].transpose(1, 2), sinks=sinks).transpose(1, 2)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_sliced_rows_fp8_cache_and_value_head_dim(fp8):
    """An FP8 cache with per-(batch, head) descales, and v's head dim 64 under q's 96."""
    batch, heads_q, heads_kv, lengths = 2, 36, 2, [130, 257]
    k_full, v_full = torch.randn(batch, 260, heads_kv, 96), torch.randn(batch, 260, heads_kv, 64)
    k_descale, v_descale = torch.rand(batch, heads_kv) + 0.5, torch.rand(batch, heads_kv) + 0.5
    k_cache = (k_full / k_descale[:, None, :, None]).to(fp8)
    v_cache = (v_full / v_descale[:, None, :, None]).to(fp8)
    k64 = k_cache.double() * k_descale[:, None, :, None].double()
    v64 = v_cache.double() * v_descale[:, None, :, None].double()
    q = torch.randn(batch, 1, heads_q, 96, dtype=torch.bfloat16)
    assert served_by_decode_kernel(q, k_cache, v_cache)
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        k_descale=k_descale, v_descale=v_descale)
    assert out.shape == (batch, 1, heads_q, 64)
    rtol, atol = OUTPUT_TOLERANCE[torch.bfloat16]
    for b, length in enumerate(lengths):
        ref, _ = flash_attn_reference(q[b:b + 1], k64[b:b + 1, :length], v64[b:b + 1, :length])
        torch.testing.assert_close(out[b:b + 1].double(), ref, rtol=rtol, atol=atol)


def test_serving_call_decodes_mqa_rows():
    """flash_attn_varlen_func over a paged cache, MQA 32/1: two decodes (the sliced decode
    kernel) and a chunked prefill (the general kernel) in one call."""
    heads_q, head_dim, dtype = 32, 64, torch.bfloat16
    lengths_q, lengths_k = [1, 21, 1], [300, 100, 7]
    k_cache, v_cache = make_cache(3, 320, 1, head_dim, dtype)
    k_pages, v_pages, table = to_paged(k_cache, v_cache, 32)
    cu_q = torch.tensor([0, 1, 22, 23], dtype=torch.int32)
    q = torch.randn(23, heads_q, head_dim, dtype=dtype)
    out = ipex_flash.flash_attn_varlen_func(
        q, k_pages, v_pages, cu_q, None, 21, 300, causal=True, block_table=table,
        seqused_k=torch.tensor(lengths_k, dtype=torch.int32))
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for b in range(3):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref, _ = flash_attn_reference(q[rows][None], k_cache[b:b + 1, :lengths_k[b]],
                                      v_cache[b:b + 1, :lengths_k[b]], causal=True)
        torch.testing.assert_close(out[rows].double(), ref[0], rtol=rtol, atol=atol)


# (heads_q, heads_kv, new tokens) one past max_sliced_decode_tokens(heads_kv).
PAST_SLICES = [(8, 4, 17), (8, 8, 17), (8, 2, 33), (8, 1, 33)]


@pytest.mark.parametrize("heads_q,heads_kv,new_tokens", PAST_SLICES)
def test_many_new_tokens_take_the_general_kernel(heads_q, heads_kv, new_tokens):
    """Past MAX_DECODE_ROWS rows per K/V head, more new tokens than slices serve (16, or 32 with
    one or two K/V heads) go to the general kernel (which wins there), and the answer is the
    same."""
    assert new_tokens == C.max_sliced_decode_tokens(heads_kv) + 1
    q = torch.randn(1, new_tokens, heads_q, 64)
    k_cache, v_cache = make_cache(1, 100, heads_kv, 64, torch.float32)
    assert not served_by_decode_kernel(q, k_cache, v_cache)
    assert served_by_decode_kernel(q[:, :-1], k_cache, v_cache)
    out, lse = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=90,
                                                  causal=True, return_softmax_lse=True)
    check_against_reference(out, lse, q, k_cache, v_cache, [90], torch.float32, causal=True)
