"""flash_attn_with_kvcache: decoding against contiguous and paged caches, in-place appends,
every option, against the flash-attn-semantics float64 reference."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import flash_attn_reference

from helpers.caches import cache_in_layout, make_cache, to_paged
from helpers.cases import DTYPES
from helpers.reference import check_against_reference


@pytest.mark.parametrize("lengths", [[1, 1], [1, 64, 65], [300, 7, 2049], [4000]])
@pytest.mark.parametrize("heads_q,heads_kv", [(4, 4), (8, 2), (16, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_one_token(dtype, heads_q, heads_kv, lengths):
    batch, head_dim = len(lengths), 64
    k_cache, v_cache = make_cache(batch, max(lengths) + 5, heads_kv, head_dim, dtype)
    q = torch.randn(batch, 1, heads_q, head_dim, dtype=dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    out, lse = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                  return_softmax_lse=True)
    check_against_reference(out, lse, q, k_cache, v_cache, lengths, dtype)


# How the decode kernel reads the cache: several K/V heads per work-group (head dim 256 fits
# 4 heads of GQA 4, so 6 heads make one full and one partial group), a head-major cache, head
# dims padded up to the compiled one (masked loads; 16-bit rows read a 32-bit word at a time),
# and 16-bit caches whose rows are not word-aligned or whose head dim is odd (then served by
# the general kernel).
@pytest.mark.parametrize("layout", ["contiguous", "head_major", "offset"])
@pytest.mark.parametrize("heads_q,heads_kv,head_dim", [(24, 6, 256), (8, 2, 40), (4, 4, 63)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_cache_layouts(dtype, heads_q, heads_kv, head_dim, layout):
    lengths = [37, 300]
    k_cache, v_cache = cache_in_layout(layout, len(lengths), 310, heads_kv, head_dim, dtype)
    q = torch.randn(len(lengths), 1, heads_q, head_dim, dtype=dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    out, lse = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                  return_softmax_lse=True)
    check_against_reference(out, lse, q, k_cache, v_cache, lengths, dtype)


# (causal, window, softcap, alibi)
OPTIONS = [(True, (-1, -1), 0.0, False), (False, (50, 0), 0.0, False),
           (True, (-1, -1), 5.0, False), (True, (-1, -1), 0.0, True), (True, (100, -1), 3.0, True)]


@pytest.mark.parametrize("new_tokens", [1, 3, 20, 40])
@pytest.mark.parametrize("causal,window,softcap,alibi", OPTIONS)
def test_append_then_attend(causal, window, softcap, alibi, new_tokens):
    """New tokens go to slots cache_seqlens[b] ..; nothing else in the cache changes; 40 new
    tokens with a GQA group of 4 and two K/V heads take the general kernel, 1, 3 and 20 the
    decode kernel (20: 80 rows per K/V head, in slices)."""
    batch, heads_q, heads_kv, head_dim, capacity = 3, 8, 2, 64, 400
    k_cache, v_cache = make_cache(batch, capacity, heads_kv, head_dim, torch.float32)
    before = (k_cache.clone(), v_cache.clone())
    q = torch.randn(batch, new_tokens, heads_q, head_dim)
    k_new = torch.randn(batch, new_tokens, heads_kv, head_dim)
    v_new = torch.randn(batch, new_tokens, heads_kv, head_dim)
    seqlens = torch.tensor([0, 17, 350], dtype=torch.int32)
    slopes = torch.rand(batch, heads_q) * 0.2 if alibi else None
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, causal=causal,
        window_size=window, softcap=softcap, alibi_slopes=slopes, return_softmax_lse=True)
    for b, start in enumerate(seqlens.tolist()):
        written = slice(start, start + new_tokens)
        assert torch.equal(k_cache[b, written], k_new[b]) and torch.equal(v_cache[b, written], v_new[b])
        untouched = torch.ones(capacity, dtype=torch.bool)
        untouched[written] = False
        assert torch.equal(k_cache[b, untouched], before[0][b, untouched])
        assert torch.equal(v_cache[b, untouched], before[1][b, untouched])
    check_against_reference(out, lse, q, k_cache, v_cache,
                            [start + new_tokens for start in seqlens.tolist()], torch.float32,
                            causal=causal, window_size=window, softcap=softcap,
                            alibi_slopes=slopes)


@pytest.mark.parametrize("page_size", [16, 48, 64, 256, 272, 512])
@pytest.mark.parametrize("new_tokens", [1, 2, 33])
def test_paged_cache_matches_contiguous(page_size, new_tokens):
    batch, heads_q, heads_kv, head_dim, capacity = 3, 8, 2, 64, 512
    k_cache, v_cache = make_cache(batch, capacity, heads_kv, head_dim, torch.bfloat16)
    k_pages, v_pages, table = to_paged(k_cache, v_cache, page_size)
    q = torch.randn(batch, new_tokens, heads_q, head_dim, dtype=torch.bfloat16)
    k_new = torch.randn(batch, new_tokens, heads_kv, head_dim, dtype=torch.bfloat16)
    v_new = torch.randn(batch, new_tokens, heads_kv, head_dim, dtype=torch.bfloat16)
    seqlens = torch.tensor([5, 255, 400], dtype=torch.int32)
    contiguous = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                    cache_seqlens=seqlens, causal=True)
    paged = ipex_flash.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new,
                                               cache_seqlens=seqlens, block_table=table,
                                               causal=True)
    assert torch.equal(paged, contiguous)
    for b, start in enumerate(seqlens.tolist()):  # appends landed in the right page slots
        for i in range(new_tokens):
            position = start + i
            page = table[b, position // page_size]
            assert torch.equal(k_pages[page, position % page_size], k_new[b, i])


def test_strided_block_table_reads_correctly():
    k_cache, v_cache = make_cache(2, 64, 2, 32, torch.float32)
    k_pages, v_pages, table = to_paged(k_cache, v_cache, 16)
    strided = table.t().contiguous().t()
    assert not strided.is_contiguous()
    q = torch.randn(2, 1, 4, 32)
    torch.testing.assert_close(
        ipex_flash.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=50, block_table=strided),
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=50), rtol=0, atol=0)


def test_cache_seqlens_as_int_and_default():
    k_cache, v_cache = make_cache(2, 100, 2, 32, torch.float32)
    q = torch.randn(2, 1, 4, 32)
    as_int = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=60)
    as_tensor = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor([60, 60], dtype=torch.int32))
    assert torch.equal(as_int, as_tensor)
    full = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache)
    ref, _ = flash_attn_reference(q, k_cache, v_cache)
    torch.testing.assert_close(full.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("build,error,message", [
    (lambda c: dict(cache_seqlens=torch.tensor([98, 0], dtype=torch.int32), k=torch.randn(2, 3, 2, 32),
                    v=torch.randn(2, 3, 2, 32)), ValueError, r"exceeds the cache capacity 100"),
    (lambda c: dict(cache_seqlens=torch.tensor([1, 2])), TypeError, r"cache_seqlens must be an int or an int32"),
    (lambda c: dict(cache_seqlens=torch.tensor([1], dtype=torch.int32)), ValueError, r"cache_seqlens must have shape \(2,\)"),
    (lambda c: dict(k=torch.randn(2, 3, 2, 32)), ValueError, r"k and v must be given together"),
    (lambda c: dict(k=torch.randn(2, 3, 2, 16), v=torch.randn(2, 3, 2, 16)), ValueError, r"k must have shape"),
    (lambda c: dict(k=torch.randn(2, 3, 2, 32).half(), v=torch.randn(2, 3, 2, 32).half()), TypeError, r"k.dtype"),
    (lambda c: dict(window_size=(-3, 0)), ValueError, r"window_size values must be >= -1"),
])
def test_bad_arguments(build, error, message):
    k_cache, v_cache = make_cache(2, 100, 2, 32, torch.float32)
    q = torch.randn(2, 1, 4, 32)
    with pytest.raises(error, match=message):
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, **build(None))


def test_bad_paging():
    q = torch.randn(2, 1, 4, 32)
    table = torch.zeros(2, 2, dtype=torch.int32)
    for size in (24, 528):
        pages = torch.randn(8, size, 2, 32)
        with pytest.raises(ValueError, match=r"page size \(k_cache.shape\[1\]\) must be a "
                                             rf"multiple of 16 up to 512, got {size}"):
            ipex_flash.flash_attn_with_kvcache(q, pages, pages, block_table=table)
    pages = torch.randn(8, 16, 2, 32)
    with pytest.raises(ValueError, match=r"block_table entries must be page indices in \[0, 8\)"):
        ipex_flash.flash_attn_with_kvcache(q, pages, pages, block_table=table + 8)
    with pytest.raises(TypeError, match=r"block_table must be an int32 tensor"):
        ipex_flash.flash_attn_with_kvcache(q, pages, pages, block_table=table.long())
    with pytest.raises(ValueError, match=r"block_table must have shape \(2, max_blocks\)"):
        ipex_flash.flash_attn_with_kvcache(q, pages, pages, block_table=table[:1])


def test_opcheck():
    k_cache, v_cache = make_cache(2, 100, 2, 32, torch.float32)
    q = torch.randn(2, 1, 4, 32)
    seqlens = torch.tensor([30, 99], dtype=torch.int32)
    torch.library.opcheck(torch.ops.ipex_flash.kvcache_attention.default,
                          (q, k_cache, v_cache, seqlens, None, None, True, -1, -1, 0.0, None))
    torch.library.opcheck(torch.ops.ipex_flash.kvcache_append.default,
                          (k_cache, v_cache, torch.randn(2, 1, 2, 32), torch.randn(2, 1, 2, 32),
                           seqlens, None))


def test_decode_kernel_refuses_what_it_does_not_serve():
    """flash_attn_with_kvcache sends these to the general kernel (test_decode_cache_layouts);
    called directly, the decode kernel raises instead of reading misaligned rows."""
    from ipex_flash.ops import launch
    k_cache, v_cache = cache_in_layout("offset", 1, 40, 2, 64, torch.bfloat16)
    q = torch.randn(1, 1, 8, 64, dtype=torch.bfloat16)
    q_v, k_v, v_v = (launch.view(t.transpose(1, 2)) for t in (q, k_cache, v_cache))
    assert not C.flash_decode_supported(q_v, k_v, v_v, 0)  # 0: the CPU device's queue
    assert C.flash_decode_supported(*(launch.view(t.float().transpose(1, 2))
                                      for t in (q, k_cache, v_cache)), 0)
    # 2 x 17 = 34 rows: more than one work-group's, of more new tokens than slices serve
    many_rows = launch.view(torch.randn(1, 8, 17, 64, dtype=torch.bfloat16))
    aligned = [launch.view(t.transpose(1, 2)) for t in make_cache(1, 40, 4, 64, torch.bfloat16)]
    assert not C.flash_decode_supported(many_rows, *aligned, 0)
    out, lse = torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16), torch.zeros(1, 8, 1)
    scratch = torch.empty(1, 8, 1, 1, 64)
    with pytest.raises(ValueError, match="flash_decode does not serve this problem"):
        C.flash_decode(q_v, k_v, v_v, launch.view(out), launch.view(lse), launch.view(scratch),
                       launch.view(scratch[..., 0]), C.AttentionOptions(), 0)
    assert not out.any()
