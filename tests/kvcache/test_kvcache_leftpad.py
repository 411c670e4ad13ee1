"""flash_attn_with_kvcache's cache_leftpad (flash-attn 2.8): sequence b attends to cache rows
cache_leftpad[b] .. cache_seqlens[b] (+ the appended tokens), its masks and ALiBi counted from
the first of them; new keys still land at cache_seqlens[b] + i and rotary still uses those
absolute positions, as flash-attn's kernel does. Against the float64 reference, with the pad
rows and the rows past the end filled with NaN, which must not leak."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import flash_attn_reference, sdpa_reference

from helpers.caches import make_cache, to_paged
from helpers.cases import DTYPES
from helpers.fp8 import quantised_cache
from helpers.reference import LSE_TOLERANCE, OUTPUT_TOLERANCE
from helpers.rotary import rotate64


def expected(q, k_cache, v_cache, k_new, v_new, seqlens, leftpad, rows=None, angles=None,
             interleaved=True, causal=False, window=(-1, -1), softcap=0.0, alibi=None):
    """(out, lse) per sequence b: cache row rows[b] after the append at seqlens[b] + i (k
    rotated at those positions; q at seqlens[b] + i when causal or local, else at
    seqlens[b]), attended over its rows leftpad[b] .. seqlens[b] + new only."""
    new = 0 if k_new is None else k_new.shape[1]
    local = causal or window != (-1, -1)
    outs, lses = [], []
    for b, (start, pad) in enumerate(zip(seqlens.tolist(), leftpad.tolist())):
        row = b if rows is None else rows[b]
        k, v, qb = k_cache[row].double().clone(), v_cache[row].double().clone(), q[b].double()
        if new:
            kb = k_new[b].double()
            if angles is not None:
                kb = rotate64(kb, angles[start:start + new][:, None, :], interleaved)
                q_positions = (torch.arange(start, start + q.shape[1]) if local
                               else torch.full((q.shape[1],), start))
                qb = rotate64(qb, angles[q_positions][:, None, :], interleaved)
            k[start:start + new], v[start:start + new] = kb, v_new[b].double()
        out, lse = flash_attn_reference(qb[None], k[None, pad:start + new], v[None, pad:start + new],
                                        causal, window, softcap,
                                        None if alibi is None else alibi[b:b + 1])
        outs.append(out[0])
        lses.append(lse[0])
    return torch.stack(outs), torch.stack(lses)


def check(out, lse, want_out, want_lse, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), want_out, rtol=rtol, atol=atol)
    empty = torch.isneginf(want_lse)  # a row that sees no key: lse -inf, output 0
    assert torch.equal(torch.isneginf(lse), empty)
    torch.testing.assert_close(lse.double()[~empty], want_lse[~empty], rtol=LSE_TOLERANCE[0],
                               atol=LSE_TOLERANCE[1])


def poison(k_cache, v_cache, seqlens, leftpad, new, rows=None):
    """NaN in every row a sequence must not read: before its pad's end and past its keys."""
    for b, (start, pad) in enumerate(zip(seqlens.tolist(), leftpad.tolist())):
        row = b if rows is None else rows[b]
        for cache in (k_cache, v_cache):
            cache[row, :pad] = float("nan")
            cache[row, start + new:] = float("nan")


def assert_only_appended(cache, before, seqlens, new, rows=None):
    """The cache equals `before` (NaN included) except rows[b]'s slots seqlens[b] + i."""
    changed = torch.zeros(cache.shape[:2], dtype=torch.bool)
    for b, start in enumerate(seqlens.tolist()):
        changed[b if rows is None else rows[b], start:start + new] = True
    torch.testing.assert_close(cache[~changed], before[~changed], rtol=0, atol=0, equal_nan=True)


# (q tokens, appended tokens): 1 and 3 new tokens take the decode kernel with GQA 4 (4 and 12
# rows per K/V head), 20 the general kernel with four K/V heads and decode slices with two, 40
# the general kernel; 0 appended attends to the cache as it is.
@pytest.mark.parametrize("len_q,new", [(1, 0), (1, 1), (3, 3), (20, 0), (20, 20), (40, 40)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_q,heads_kv", [(4, 4), (8, 2)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(dtype, heads_q, heads_kv, causal, len_q, new):
    """Pads of 13, all (the second sequence keeps no cached key) and 0 rows; lengths no
    multiple of the 64-key tile; the caller's tensors stay as they were, but for the appends."""
    batch, head_dim, capacity = 3, 64, 333
    k_cache, v_cache = make_cache(batch, capacity, heads_kv, head_dim, dtype)
    seqlens = torch.tensor([150, 77, 290], dtype=torch.int32)
    leftpad = torch.tensor([13, 77, 0], dtype=torch.int32)
    poison(k_cache, v_cache, seqlens, leftpad, new)
    q = torch.randn(batch, len_q, heads_q, head_dim, dtype=dtype)
    k_new, v_new = ((torch.randn(batch, new, heads_kv, head_dim, dtype=dtype) for _ in range(2))
                    if new else (None, None))
    inputs = [t.clone() for t in (q, seqlens, leftpad) + ((k_new, v_new) if new else ())]
    before = (k_cache.clone(), v_cache.clone())
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, cache_leftpad=leftpad,
        causal=causal, return_softmax_lse=True)
    check(out, lse, *expected(q, *before, k_new, v_new, seqlens, leftpad, causal=causal), dtype)
    for given, copy in zip((q, seqlens, leftpad) + ((k_new, v_new) if new else ()), inputs):
        assert torch.equal(given, copy)
    assert_only_appended(k_cache, before[0], seqlens, new)
    assert_only_appended(v_cache, before[1], seqlens, new)
    for b, start in enumerate(seqlens.tolist()):
        if new:
            assert torch.equal(k_cache[b, start:start + new], k_new[b])


def test_zero_pad_equals_no_pad():
    k_cache, v_cache = make_cache(2, 200, 2, 64, torch.float32)
    q = torch.randn(2, 1, 8, 64)
    seqlens = torch.tensor([199, 61], dtype=torch.int32)
    plain = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    padded = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                cache_leftpad=torch.zeros(2, dtype=torch.int32))
    assert torch.equal(plain, padded)


# (causal, window, softcap, alibi): each measured from the first key after the pad.
OPTIONS = [(True, (-1, -1), 5.0, False), (True, (-1, -1), 0.0, True), (False, (40, 0), 0.0, False),
           (True, (100, -1), 3.0, True)]


@pytest.mark.parametrize("new", [1, 20])
@pytest.mark.parametrize("causal,window,softcap,alibi", OPTIONS)
def test_score_options(causal, window, softcap, alibi, new):
    batch, heads_q, heads_kv, head_dim = 2, 8, 2, 64
    k_cache, v_cache = make_cache(batch, 400, heads_kv, head_dim, torch.float32)
    seqlens = torch.tensor([230, 301], dtype=torch.int32)
    leftpad = torch.tensor([101, 7], dtype=torch.int32)
    poison(k_cache, v_cache, seqlens, leftpad, new)
    before = (k_cache.clone(), v_cache.clone())
    q = torch.randn(batch, new, heads_q, head_dim)
    k_new, v_new = (torch.randn(batch, new, heads_kv, head_dim) for _ in range(2))
    slopes = torch.rand(batch, heads_q) * 0.2 if alibi else None
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, cache_leftpad=leftpad,
        causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes,
        return_softmax_lse=True)
    check(out, lse, *expected(q, *before, k_new, v_new, seqlens, leftpad, causal=causal,
                              window=window, softcap=softcap, alibi=slopes), torch.float32)


@pytest.mark.parametrize("len_q", [1, 20])
def test_sinks(len_q):
    k_cache, v_cache = make_cache(2, 300, 2, 64, torch.float32)
    seqlens = torch.tensor([299, 150], dtype=torch.int32)
    leftpad = torch.tensor([50, 149], dtype=torch.int32)
    poison(k_cache, v_cache, seqlens, leftpad, 0)
    q = torch.randn(2, len_q, 8, 64)
    sinks = torch.randn(8) * 2
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                             cache_leftpad=leftpad, sinks=sinks)
    for b, (end, pad) in enumerate(zip(seqlens.tolist(), leftpad.tolist())):
        want = sdpa_reference(*(t[b:b + 1, :, :].transpose(1, 2) for t in (q,)),
                              k_cache[b:b + 1, pad:end].transpose(1, 2),
                              v_cache[b:b + 1, pad:end].transpose(1, 2), sinks=sinks)
        torch.testing.assert_close(out[b:b + 1].double(), want.transpose(1, 2),
                                   rtol=OUTPUT_TOLERANCE[torch.float32][0],
                                   atol=OUTPUT_TOLERANCE[torch.float32][1])


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("new", [1, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_positions_are_cache_rows(dtype, new, causal, interleaved):
    """The new keys and q rotate at cache_seqlens[b] + i, not at the position after the pad
    (flash-attn offsets its cos/sin rows by the pad)."""
    batch, heads_q, heads_kv, head_dim, capacity = 2, 8, 2, 64, 260
    k_cache, v_cache = make_cache(batch, capacity, heads_kv, head_dim, dtype)
    seqlens = torch.tensor([9, 200], dtype=torch.int32)
    leftpad = torch.tensor([4, 120], dtype=torch.int32)
    poison(k_cache, v_cache, seqlens, leftpad, new)
    before = (k_cache.clone(), v_cache.clone())
    q = torch.randn(batch, new, heads_q, head_dim, dtype=dtype)
    k_new, v_new = (torch.randn(batch, new, heads_kv, head_dim, dtype=dtype) for _ in range(2))
    angles = torch.rand(capacity, 16, dtype=torch.float64) * 2 * math.pi
    cos, sin = angles.cos().float(), angles.sin().float()
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cos, sin, seqlens, cache_leftpad=leftpad,
        causal=causal, rotary_interleaved=interleaved, return_softmax_lse=True)
    want_out, want_lse = expected(q, *before, k_new, v_new, seqlens, leftpad, angles=angles,
                                  interleaved=interleaved, causal=causal)
    # LSE_TOLERANCE holds for the reference's own inputs: in bfloat16 the kernel sees q and k
    # rotated and then rounded, so only its output is compared (as test_kvcache_api's rotary).
    if dtype == torch.float32:
        check(out, lse, want_out, want_lse, dtype)
    else:
        torch.testing.assert_close(out.double(), want_out, rtol=OUTPUT_TOLERANCE[dtype][0],
                                   atol=OUTPUT_TOLERANCE[dtype][1])
    for b, start in enumerate(seqlens.tolist()):  # the cache holds keys rotated there
        rotated = rotate64(k_new[b], angles[start:start + new][:, None, :], interleaved)
        torch.testing.assert_close(k_cache[b, start:start + new].double(), rotated,
                                   rtol=OUTPUT_TOLERANCE[dtype][0], atol=OUTPUT_TOLERANCE[dtype][1])


@pytest.mark.parametrize("new", [1, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_with_cache_batch_idx(dtype, new):
    """cache_leftpad[b] is sequence b's, whichever cache row it reads (cache_batch_idx[b])."""
    k_cache, v_cache = make_cache(5, 300, 2, 64, dtype)
    rows = torch.tensor([4, 0, 2], dtype=torch.int32)
    seqlens = torch.tensor([270, 10, 123], dtype=torch.int32)
    leftpad = torch.tensor([200, 3, 0], dtype=torch.int32)
    poison(k_cache, v_cache, seqlens, leftpad, new, rows.tolist())
    before = (k_cache.clone(), v_cache.clone())
    q = torch.randn(3, new, 8, 64, dtype=dtype)
    k_new, v_new = (torch.randn(3, new, 2, 64, dtype=dtype) for _ in range(2))
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, cache_batch_idx=rows,
        cache_leftpad=leftpad, causal=True, return_softmax_lse=True)
    check(out, lse, *expected(q, *before, k_new, v_new, seqlens, leftpad, rows.tolist(),
                              causal=True), dtype)
    assert_only_appended(k_cache, before[0], seqlens, new, rows.tolist())
    assert_only_appended(v_cache, before[1], seqlens, new, rows.tolist())


@pytest.mark.parametrize("new", [1, 40])
def test_matrix_kernels_emulated(monkeypatch, new):
    """The decode kernel's matrix scores (K tiles read in place) and the matrix forward kernel
    (its K/V pack), with joint_matrix emulated so that they run on any machine."""
    monkeypatch.setenv("IPEX_FLASH_MATRIX", "emulate")
    assert C.warmup_fwd("bfloat16", 64, 0).matrix_emulated
    assert C.warmup_decode("bfloat16", 64, 4, 0).matrix_emulated  # GQA 4 x 1 token = 4 rows
    k_cache, v_cache = make_cache(2, 336, 2, 64, torch.bfloat16)
    seqlens = torch.tensor([290, 100], dtype=torch.int32)
    leftpad = torch.tensor([37, 99], dtype=torch.int32)
    poison(k_cache, v_cache, seqlens, leftpad, new)
    before = (k_cache.clone(), v_cache.clone())
    q = torch.randn(2, new, 8, 64, dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(2, new, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, cache_leftpad=leftpad,
        causal=True, return_softmax_lse=True)
    check(out, lse, *expected(q, *before, k_new, v_new, seqlens, leftpad, causal=True),
          torch.bfloat16)


def test_opcheck():
    k_cache, v_cache = make_cache(2, 100, 2, 32, torch.float32)
    q = torch.randn(2, 1, 4, 32)
    seqlens = torch.tensor([30, 99], dtype=torch.int32)
    leftpad = torch.tensor([29, 5], dtype=torch.int32)
    torch.library.opcheck(torch.ops.ipex_flash.kvcache_attention.default,
                          (q, k_cache, v_cache, seqlens, None, None, True, -1, -1, 0.0, None),
                          {"cache_leftpad": leftpad})


@pytest.mark.parametrize("len_q", [1, 20])
def test_fp8_cache(len_q):
    """An FP8 cache with per-head descales: the pad rows are skipped before dequantising."""
    fp8, dtype = torch.float8_e4m3fn, torch.bfloat16
    (k_cache, v_cache), (k_descale, v_descale), (k64, v64) = quantised_cache(2, 250, 2, 64, fp8,
                                                                             per_head=True)
    seqlens = torch.tensor([249, 90], dtype=torch.int32)
    leftpad = torch.tensor([60, 1], dtype=torch.int32)
    q = torch.randn(2, len_q, 8, 64, dtype=dtype)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                             cache_leftpad=leftpad, causal=True,
                                             k_descale=k_descale, v_descale=v_descale)
    want, _ = expected(q, k64, v64, None, None, seqlens, leftpad, causal=True)
    torch.testing.assert_close(out.double(), want, rtol=OUTPUT_TOLERANCE[dtype][0],
                               atol=OUTPUT_TOLERANCE[dtype][1])


@pytest.mark.parametrize("build,error,message", [
    (lambda s: dict(cache_leftpad=torch.zeros(2, dtype=torch.int64)), TypeError,
     r"cache_leftpad must be an int32 tensor of shape \(2,\), got torch.int64"),
    (lambda s: dict(cache_leftpad=[0, 0]), TypeError, r"cache_leftpad must be an int32 tensor"),
    (lambda s: dict(cache_leftpad=torch.zeros(3, dtype=torch.int32)), ValueError,
     r"cache_leftpad must have shape \(2,\), got \(3,\)"),
    (lambda s: dict(cache_leftpad=torch.zeros(2, dtype=torch.int32, device="meta")), ValueError,
     r"cache_leftpad is on meta, q on cpu"),
    (lambda s: dict(cache_leftpad=torch.tensor([0, 41], dtype=torch.int32)), ValueError,
     r"0 <= cache_leftpad\[b\] <= cache_seqlens\[b\], got cache_leftpad \[0, 41\] and "
     r"cache_seqlens \[10, 40\]"),
    (lambda s: dict(cache_leftpad=torch.tensor([-1, 0], dtype=torch.int32)), ValueError,
     r"0 <= cache_leftpad\[b\] <= cache_seqlens\[b\]"),
    # With new tokens the pad is bounded by the cached keys, not by the keys after the append.
    (lambda s: dict(cache_leftpad=torch.tensor([11, 0], dtype=torch.int32), k=s, v=s),
     ValueError, r"0 <= cache_leftpad\[b\] <= cache_seqlens\[b\]"),
])
def test_bad_arguments(build, error, message):
    k_cache, v_cache = make_cache(2, 64, 2, 32, torch.float32)
    q = torch.randn(2, 1, 4, 32)
    seqlens = torch.tensor([10, 40], dtype=torch.int32)
    before = k_cache.clone()
    with pytest.raises(error, match=message):
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                           **build(torch.randn(2, 1, 2, 32)))
    assert torch.equal(k_cache, before)  # nothing appended before the check


def test_refused_with_block_table():
    k_cache, v_cache = make_cache(2, 64, 2, 32, torch.float32)
    k_pages, v_pages, table = to_paged(k_cache, v_cache, 16)
    with pytest.raises(ValueError, match=r"cache_leftpad and block_table \(a paged KV cache\) "
                                         r"cannot be used together"):
        ipex_flash.flash_attn_with_kvcache(torch.randn(2, 1, 4, 32), k_pages, v_pages,
                                           cache_seqlens=30, block_table=table,
                                           cache_leftpad=torch.zeros(2, dtype=torch.int32))
