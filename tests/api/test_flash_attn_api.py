"""flash_attn_func and flash_attn_varlen_func against a float64 reference written from
flash-attn's documented semantics: bottom-right causal masks, sliding windows, softcap, ALiBi,
rows that see no key, Nq != Nk both ways, GQA, and gradients."""
import pytest
import torch

import ipex_flash
from ipex_flash.reference import flash_attn_reference

from helpers.cases import DTYPES
from helpers.flash_attn import (OPTIONS, assert_close_with_lse, check_gradients_match_reference,
                                pack, random_bnhd)

LENGTHS = [(1, 1), (1, 130), (130, 1), (77, 200), (200, 77), (128, 128)]


@pytest.mark.parametrize("len_q,len_k", LENGTHS)
@pytest.mark.parametrize("causal,window,softcap,alibi", OPTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_matches_reference(dtype, causal, window, softcap, alibi, len_q, len_k):
    q, k, v = random_bnhd(2, len_q, len_k, 4, 2, 64, dtype)
    slopes = torch.rand(2, 4) * 0.3 if alibi else None
    out, lse, keep = ipex_flash.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                                softcap=softcap, alibi_slopes=slopes,
                                                return_attn_probs=True)
    assert keep is None and out.shape == q.shape and lse.shape == (2, 4, len_q)
    ref_out, ref_lse = flash_attn_reference(q, k, v, causal, window, softcap, slopes)
    assert_close_with_lse(out, lse, ref_out, ref_lse, dtype)


def test_rows_without_keys_are_zero_with_lse_minus_inf():
    """Bottom-right causal with Nq > Nk: the first Nq - Nk rows see nothing."""
    q, k, v = random_bnhd(1, 10, 4, 2, 2, 32, torch.float32)
    out, lse, _ = ipex_flash.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out[:, :6], torch.zeros_like(out[:, :6]))
    assert torch.isneginf(lse[:, :, :6]).all() and torch.isfinite(lse[:, :, 6:]).all()


@pytest.mark.parametrize("causal,window,softcap,alibi", OPTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_match_reference(dtype, causal, window, softcap, alibi):
    check_gradients_match_reference(dtype, causal, window, softcap, alibi)


@pytest.mark.parametrize("causal,window,softcap,alibi", OPTIONS[:2] + OPTIONS[-2:])
@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_matches_per_sequence_reference(dtype, causal, window, softcap, alibi):
    """Packed batches with lengths 1, 0 and odd sizes give each sequence's own attention."""
    lengths = [(5, 9), (1, 1), (0, 4), (130, 70), (17, 200), (3, 0)]
    qs, ks, vs = zip(*[(torch.randn(nq, 4, 64, dtype=dtype), torch.randn(nk, 2, 64, dtype=dtype),
                        torch.randn(nk, 2, 64, dtype=dtype)) for nq, nk in lengths])
    q, cu_q, max_q = pack(qs)
    k, cu_k, max_k = pack(ks)
    v, _, _ = pack(vs)
    slopes = torch.rand(len(lengths), 4) * 0.3 if alibi else None
    out, lse, probs = ipex_flash.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window, softcap=softcap,
        alibi_slopes=slopes, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (4, q.shape[0]) and probs is None
    for i, (nq, nk) in enumerate(lengths):
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        if nk == 0:  # no keys at all: zeros, LSE -inf
            assert torch.equal(out[rows], torch.zeros_like(out[rows]))
            assert torch.isneginf(lse[:, rows]).all()
            continue
        ref_out, ref_lse = flash_attn_reference(
            qs[i][None], ks[i][None], vs[i][None], causal, window, softcap,
            None if slopes is None else slopes[i])
        assert_close_with_lse(out[rows][None], lse[:, rows][None], ref_out, ref_lse, dtype)


def test_varlen_gradients_match_per_sequence():
    lengths = [(5, 9), (1, 1), (40, 33), (70, 90)]
    qs, ks, vs = zip(*[(torch.randn(nq, 4, 32), torch.randn(nk, 2, 32), torch.randn(nk, 2, 32))
                       for nq, nk in lengths])
    q, cu_q, max_q = pack(qs)
    k, cu_k, max_k = pack(ks)
    v, _, _ = pack(vs)
    grad_out = torch.randn(q.shape)
    a, b, c = (t.clone().requires_grad_() for t in (q, k, v))
    ipex_flash.flash_attn_varlen_func(a, b, c, cu_q, cu_k, max_q, max_k, causal=True).backward(grad_out)
    for i in range(len(lengths)):
        rows_q = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rows_k = slice(int(cu_k[i]), int(cu_k[i + 1]))
        a64, b64, c64 = (t.double()[None].requires_grad_() for t in (qs[i], ks[i], vs[i]))
        flash_attn_reference(a64, b64, c64, causal=True)[0].backward(grad_out[rows_q].double()[None])
        for got, want in ((a.grad[rows_q], a64.grad[0]), (b.grad[rows_k], b64.grad[0]),
                          (c.grad[rows_k], c64.grad[0])):
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def probabilities64(q, k, causal, window=(-1, -1), softcap=0.0, slopes=None):
    """The reference's softmax probabilities (B, H, Nq, Nk): d out / d v's row weights, read
    off the float64 reference with an identity V."""
    n_k, heads_kv = k.shape[1], k.shape[2]
    eye = torch.eye(n_k, dtype=torch.float64)[None, :, None, :].expand(k.shape[0], n_k,
                                                                       heads_kv, n_k)
    weights, _ = flash_attn_reference(q, k, eye, causal, window, softcap, slopes)
    return weights.transpose(1, 2)  # (B, Nq, H, Nk) -> (B, H, Nq, Nk)


@pytest.mark.parametrize("causal,window,softcap,alibi", [OPTIONS[1], OPTIONS[2], OPTIONS[-1]])
def test_dropout_and_attn_probs(causal, window, softcap, alibi):
    """S_dmask: the softmax probabilities, negative where dropout dropped the entry; the
    output is the reference's under that keep-mask."""
    p = 0.25
    q, k, v = random_bnhd(2, 33, 45, 4, 2, 32, torch.float32)
    slopes = torch.rand(4) * 0.3 if alibi else None
    out, lse, probs = ipex_flash.flash_attn_func(q, k, v, dropout_p=p, causal=causal,
                                                 window_size=window, softcap=softcap,
                                                 alibi_slopes=slopes, return_attn_probs=True)
    assert probs.shape == (2, 4, 33, 45) and probs.dtype == torch.float32
    keep = probs >= 0
    assert 0.6 < keep.double().mean().item() < 0.9
    torch.testing.assert_close(probs.abs().double(),
                               probabilities64(q, k, causal, window, softcap, slopes),
                               rtol=1e-5, atol=1e-6)
    ref_out, _ = flash_attn_reference(q, k, v, causal, window, softcap, slopes, keep=keep,
                                      dropout_p=p)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)


def test_varlen_attn_probs_padded_per_sequence():
    p = 0.3
    lengths = [(5, 9), (40, 33), (1, 1)]
    qs, ks, vs = zip(*[(torch.randn(nq, 4, 32), torch.randn(nk, 2, 32), torch.randn(nk, 2, 32))
                       for nq, nk in lengths])
    q, cu_q, max_q = pack(qs)
    k, cu_k, max_k = pack(ks)
    v, _, _ = pack(vs)
    out, lse, probs = ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, p,
                                                        causal=True, return_attn_probs=True)
    assert probs.shape == (3, 4, max_q, max_k)
    for i, (nq, nk) in enumerate(lengths):
        got = probs[i, :, :nq, :nk]
        torch.testing.assert_close(got.abs().double(),
                                   probabilities64(qs[i][None], ks[i][None], True)[0],
                                   rtol=1e-5, atol=1e-6)
        assert not probs[i, :, nq:].any() and not probs[i, :, :, nk:].any()
        ref_out, _ = flash_attn_reference(qs[i][None], ks[i][None], vs[i][None], True,
                                          keep=got[None] >= 0, dropout_p=p)
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        torch.testing.assert_close(out[rows][None].double(), ref_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(window_size=(-2, 0)), ValueError, r"window_size values must be >= -1"),
    (dict(window_size=5), ValueError, r"window_size must be a pair"),
    (dict(softcap=-1.0), ValueError, r"softcap must be a finite number >= 0"),
    (dict(alibi_slopes=torch.rand(3)), ValueError, r"alibi_slopes must have shape \(4,\) or \(2, 4\)"),
    (dict(alibi_slopes=torch.rand(4).double()), TypeError, r"alibi_slopes must be a float32"),
    (dict(dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
])
def test_bad_options(kwargs, error, message):
    q, k, v = random_bnhd(2, 8, 8, 4, 2, 32, torch.float32)
    with pytest.raises(error, match=message):
        ipex_flash.flash_attn_func(q, k, v, **kwargs)


def test_bad_layouts_and_cu_seqlens():
    q, k, v = random_bnhd(2, 8, 8, 4, 2, 32, torch.float32)
    with pytest.raises(ValueError, match=r"q must be 4-D \(batch, seq_len, heads, head_dim\)"):
        ipex_flash.flash_attn_func(q[0], k, v)
    packed = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    with pytest.raises(TypeError, match=r"cu_seqlens_q must be an int32 tensor"):
        ipex_flash.flash_attn_varlen_func(*packed, cu.long(), cu, 8, 8)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must start at 0, never decrease"):
        ipex_flash.flash_attn_varlen_func(*packed, cu, torch.tensor([0, 9, 8], dtype=torch.int32), 8, 8)
    with pytest.raises(ValueError, match=r"end at most at the packed length 16"):
        ipex_flash.flash_attn_varlen_func(*packed, cu, torch.tensor([0, 8, 17], dtype=torch.int32), 8, 8)
    with pytest.raises(ValueError, match=r"more than max_seqlen_q=4"):
        ipex_flash.flash_attn_varlen_func(*packed, cu, cu, 4, 8)
    with pytest.raises(ValueError, match=r"cu_seqlens_k describes 1 sequences, cu_seqlens_q 2"):
        ipex_flash.flash_attn_varlen_func(*packed, cu, torch.tensor([0, 16], dtype=torch.int32), 8, 16)


def test_opcheck_and_compile():
    q, k, v = (t.requires_grad_() for t in random_bnhd(1, 20, 30, 4, 2, 32, torch.float32))
    args = (q, k, v, None, None, 0, 0, None, True, 8, -1, 2.0, torch.rand(4), 0.0, None)
    torch.library.opcheck(torch.ops.ipex_flash.flash_attn_forward.default, args)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b, c: ipex_flash.flash_attn_func(a, b, c, causal=True),
                             fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), ipex_flash.flash_attn_func(q, k, v, causal=True))


def test_varlen_opcheck_and_compile():
    """The packed op's fake implementation reads nothing from cu_seqlens (its contents are
    unknown under torch.compile): opcheck passes and a fullgraph compile matches eager,
    gradients too."""
    cu_q = torch.tensor([0, 7, 19], dtype=torch.int32)
    cu_k = torch.tensor([0, 11, 24], dtype=torch.int32)
    q = torch.randn(19, 4, 32, requires_grad=True)
    k, v = (torch.randn(24, 2, 32, requires_grad=True) for _ in range(2))
    torch.library.opcheck(torch.ops.ipex_flash.flash_attn_forward.default,
                          (q, k, v, cu_q, cu_k, 12, 13, None, True, -1, -1, 0.0, None, 0.0, None))
    torch._dynamo.reset()

    def call(a, b, c):
        return ipex_flash.flash_attn_varlen_func(a, b, c, cu_q, cu_k, 12, 13, causal=True)

    compiled = torch.compile(call, fullgraph=True)(q, k, v)
    eager = call(q, k, v)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    grad = torch.randn(eager.shape)
    for g_compiled, g_eager in zip(torch.autograd.grad(compiled, (q, k, v), grad),
                                   torch.autograd.grad(eager, (q, k, v), grad)):
        torch.testing.assert_close(g_compiled, g_eager, rtol=0, atol=0)


def test_strided_side_inputs_read_correctly():
    """ALiBi slopes and cu_seqlens given as strided views give the same results as dense ones
    (the kernels read them by address)."""
    q, k, v = random_bnhd(2, 40, 50, 4, 2, 32, torch.float32)
    slopes = torch.rand(2, 8)[:, ::2]
    assert not slopes.is_contiguous()
    out = ipex_flash.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    torch.testing.assert_close(out, ipex_flash.flash_attn_func(q, k, v, causal=True,
                                                               alibi_slopes=slopes.contiguous()),
                               rtol=0, atol=0)
    packed = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
    cu_q = torch.tensor([0, 0, 40, 0, 80], dtype=torch.int32)[::2]
    cu_k = torch.tensor([0, 0, 50, 0, 100], dtype=torch.int32)[::2]
    assert not cu_q.is_contiguous()
    varlen = ipex_flash.flash_attn_varlen_func(*packed, cu_q, cu_k, 40, 50, causal=True)
    fixed = ipex_flash.flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(varlen, fixed.reshape(varlen.shape), rtol=0, atol=0)
