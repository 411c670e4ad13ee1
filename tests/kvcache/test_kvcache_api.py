"""flash_attn_with_kvcache's flash-attn arguments beyond the cache itself: positional order,
rotary embedding of q and the new k, cache_batch_idx and num_splits, each against a float64
reference built from the documented semantics."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash.reference import flash_attn_reference

from helpers.caches import make_cache
from helpers.cases import DTYPES
from helpers.reference import LSE_TOLERANCE, OUTPUT_TOLERANCE
from helpers.rotary import expected, rotate64



@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (False, (50, 0))])
@pytest.mark.parametrize("rotary_dim,new", [(64, 1), (32, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary(dtype, rotary_dim, new, causal, window, interleaved):
    batch, heads_q, heads_kv, head_dim, capacity = 2, 8, 2, 64, 200
    k_cache, v_cache = make_cache(batch, capacity, heads_kv, head_dim, dtype)
    before = k_cache.clone()
    q = torch.randn(batch, new, heads_q, head_dim, dtype=dtype)
    k_new, v_new = (torch.randn(batch, new, heads_kv, head_dim, dtype=dtype) for _ in range(2))
    seqlens = torch.tensor([7, 150], dtype=torch.int32)
    angles = torch.rand(capacity, rotary_dim // 2, dtype=torch.float64) * 2 * math.pi
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, angles.cos().float(), angles.sin().float(), seqlens,
        causal=causal, window_size=window, rotary_interleaved=interleaved)
    want = expected(q, before, v_cache, k_new, v_new, seqlens, [0, 1], causal, angles,
                    interleaved, window)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), want, rtol=rtol, atol=atol)
    for b, start in enumerate(seqlens.tolist()):  # the cache holds the rotated keys
        rotated = rotate64(k_new[b], angles[start:start + new][:, None, :], interleaved)
        torch.testing.assert_close(k_cache[b, start:start + new].double(), rotated,
                                   rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_batch_idx(dtype):
    """Sequence b reads and appends to cache row cache_batch_idx[b]; other rows are untouched.
    A cache length that is no multiple of 16 is fine."""
    k_cache, v_cache = make_cache(5, 300, 2, 64, dtype)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    q = torch.randn(3, 1, 4, 64, dtype=dtype)
    k_new, v_new = (torch.randn(3, 1, 2, 64, dtype=dtype) for _ in range(2))
    rows = torch.tensor([4, 0, 2], dtype=torch.int32)
    seqlens = torch.tensor([299, 10, 123], dtype=torch.int32)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                             cache_seqlens=seqlens, cache_batch_idx=rows,
                                             causal=True)
    want = expected(q, before_k, before_v, k_new, v_new, seqlens, rows.tolist(), True)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), want, rtol=rtol, atol=atol)
    for untouched in (1, 3):
        assert torch.equal(k_cache[untouched], before_k[untouched])
        assert torch.equal(v_cache[untouched], before_v[untouched])
    assert torch.equal(k_cache[4, 299], k_new[0, 0]) and torch.equal(k_cache[0, 10], k_new[1, 0])


@pytest.mark.parametrize("num_splits", [0, 1, 3, 7])
def test_num_splits(num_splits):
    k_cache, v_cache = make_cache(2, 1000, 2, 64, torch.float32)
    q = torch.randn(2, 1, 8, 64)
    seqlens = torch.tensor([1000, 37], dtype=torch.int32)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                             num_splits=num_splits)
    for b, n in enumerate(seqlens.tolist()):
        want, _ = flash_attn_reference(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
        torch.testing.assert_close(out[b:b + 1].double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 5])
def test_one_split_and_many_with_sinks(dtype, num_splits):
    """One split writes the output and LSE in the decode kernel itself, more go through the
    merge kernel: both against float64, with a sink per head and a sequence without keys
    (zeros, and the sink's logit as its LSE)."""
    k_cache, v_cache = make_cache(3, 300, 2, 64, dtype)
    q = torch.randn(3, 2, 8, 64, dtype=dtype)
    sinks = torch.randn(8)
    seqlens = torch.tensor([300, 0, 41], dtype=torch.int32)
    out, lse = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                  num_splits=num_splits, sinks=sinks,
                                                  return_softmax_lse=True)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for b, n in enumerate(seqlens.tolist()):
        sink = sinks.double()[:, None]  # (H, 1) against lse (H, Nq)
        if n == 0:
            assert torch.equal(out[b], torch.zeros_like(out[b]))
            torch.testing.assert_close(lse[b].double(), sink.expand(8, 2), rtol=LSE_TOLERANCE[0],
                                       atol=LSE_TOLERANCE[1])
            continue
        want, want_lse = flash_attn_reference(q[b:b + 1], k_cache[b:b + 1, :n],
                                              v_cache[b:b + 1, :n])
        with_sink = torch.logaddexp(want_lse[0], sink)
        want = want * torch.exp(want_lse[0] - with_sink).transpose(0, 1)[None, :, :, None]
        torch.testing.assert_close(out[b:b + 1].double(), want, rtol=rtol, atol=atol)
        torch.testing.assert_close(lse[b].double(), with_sink, rtol=LSE_TOLERANCE[0],
                                   atol=LSE_TOLERANCE[1])


def test_positional_order_is_flash_attns():
    """(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
    cache_leftpad, block_table, softmax_scale, causal, ...) as in flash-attn 2.8."""
    k_cache, v_cache = make_cache(2, 64, 2, 32, torch.float32)
    q = torch.randn(2, 1, 4, 32)
    seqlens = torch.tensor([20, 64], dtype=torch.int32)
    rows = torch.tensor([1, 0], dtype=torch.int32)
    by_position = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, None, None, None, None,
                                                     seqlens, rows, None, None, 0.3, True)
    by_name = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                 cache_batch_idx=rows, softmax_scale=0.3,
                                                 causal=True)
    assert torch.equal(by_position, by_name)
    want = torch.cat([flash_attn_reference(q[b:b + 1], k_cache[r:r + 1, :n], v_cache[r:r + 1, :n],
                                           True, scale=0.3)[0]
                      for b, (r, n) in enumerate(zip(rows.tolist(), seqlens.tolist()))])
    torch.testing.assert_close(by_name.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("build,error,message", [
    (lambda t: dict(rotary_cos=t), ValueError, "rotary_cos and rotary_sin must be given together"),
    (lambda t: dict(rotary_cos=t, rotary_sin=t), ValueError, "k and v must be given"),
    (lambda t: dict(rotary_cos=torch.ones(8, 40), rotary_sin=torch.ones(8, 40)), ValueError,
     r"rotary_dim \(2 \* rotary_cos.shape\[1\] = 80\) must be in"),
    (lambda t: dict(cache_batch_idx=torch.tensor([0, 5], dtype=torch.int32)), ValueError,
     r"cache_batch_idx entries must index k_cache's batch, in \[0, 2\)"),
    (lambda t: dict(cache_batch_idx=torch.tensor([0, 1])), TypeError, "cache_batch_idx must be"),
    (lambda t: dict(cache_leftpad=torch.zeros(2, dtype=torch.int64)), TypeError,
     "cache_leftpad must be an int32 tensor"),
    (lambda t: dict(num_splits=-1), ValueError, "num_splits must be an int >= 0"),
])
def test_bad_arguments(build, error, message):
    k_cache, v_cache = make_cache(2, 64, 2, 32, torch.float32)
    q = torch.randn(2, 1, 4, 32)
    with pytest.raises(error, match=message):
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, **build(torch.ones(64, 8)))


def test_cache_rows_of_any_length_through_cache_batch_idx():
    """cache_batch_idx reads each sequence's cache row as one page of seqlen_cache keys: a
    length off the decode kernel's runs of 16 keys (40 rows here), every key attended."""
    k_cache, v_cache = make_cache(3, 40, 2, 32, torch.float32)
    q = torch.randn(2, 1, 4, 32)
    seqlens = torch.tensor([40, 27], dtype=torch.int32)
    rows = torch.tensor([2, 0], dtype=torch.int32)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                             cache_batch_idx=rows, causal=True)
    want = torch.cat([flash_attn_reference(q[b:b + 1], k_cache[r:r + 1, :n], v_cache[r:r + 1, :n],
                                           True)[0]
                      for b, (r, n) in enumerate(zip(rows.tolist(), seqlens.tolist()))])
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_pages_off_runs_of_16_keys_are_refused_by_the_op():
    """The cache op itself (what engines call) refuses pages of a size the decode kernels'
    page lookups cannot serve, naming page_size, rather than reading the wrong rows."""
    k_cache, v_cache = make_cache(4, 24, 2, 32, torch.float32)
    q = torch.randn(1, 1, 4, 32)
    table = torch.tensor([[0, 3]], dtype=torch.int32)
    with pytest.raises(ValueError, match="page_size must be a multiple of 16, got 24"):
        torch.ops.ipex_flash.kvcache_attention(q, k_cache, v_cache,
                                               torch.tensor([40], dtype=torch.int32), table,
                                               None, True, -1, -1, 0.0, None)
