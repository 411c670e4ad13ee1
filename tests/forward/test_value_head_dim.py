"""V's head dim differing from Q's and K's (Dv != D, MLA prefill: D = 192, Dv = 128) through
every public API, forward and backward, against the float64 reference: the vector kernels, the
decode kernel, the matrix kernels under emulation, fake tensors / torch.compile, and the
errors that name a wrong argument."""
import pytest
import torch
import torch.nn.functional as F

import ipex_flash
from ipex_flash.ops import launch
from ipex_flash.ops.attention_forward import sdpa_options
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference, flash_attn_reference, sdpa_reference

from helpers.caches import make_cache, to_paged
from helpers.cases import DTYPES, tiered
from helpers.reference import (LSE_TOLERANCE, OUTPUT_TOLERANCE, assert_matches_reference,
                               check_against_reference)

# (D, Dv): MLA prefill, both orders of a 2x difference, and sizes padded up to the compiled
# head dim (40 and 72 both run in the 80 kernel).
DIMS = [(192, 128), (128, 64), (64, 128), (40, 72)]
# Lengths not multiples of the 64-row blocks, and single rows (which the decode kernel serves
# with GQA 2: two query rows per K/V head).
LENGTHS = [(1, 1), (1, 33), (70, 131), (113, 70)]


def qkv(batch, heads_q, heads_kv, len_q, len_k, d, d_v, dtype):
    return (torch.randn(batch, heads_q, len_q, d, dtype=dtype),
            torch.randn(batch, heads_kv, len_k, d, dtype=dtype),
            torch.randn(batch, heads_kv, len_k, d_v, dtype=dtype))


def bnhd(batch, len_q, len_k, heads_q, heads_kv, d, d_v, dtype):
    """flash-attn's layout (B, N, H, D)."""
    return tuple(t.transpose(1, 2).contiguous()
                 for t in qkv(batch, heads_q, heads_kv, len_q, len_k, d, d_v, dtype))


def grads_of(fn, tensors, grad_out):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    fn(*leaves).backward(grad_out)
    return [t.grad for t in leaves]


def check_gradients(fn, ref_fn, q, k, v, grad_out, dtype):
    """dq, dk, dv of fn against float64 autograd through ref_fn, by test_flash_attn_api.py's
    gradient rule: max error <= rtol * max(1, max |gradient|). (test_backward.py's rule, twice
    torch SDPA's error, does not fit here: with Dv != D torch runs its math path upcast to
    float32, so its error is the final rounding alone, which a kernel rounding one value the
    other way at a tie already doubles.)"""
    got = grads_of(fn, (q, k, v), grad_out)
    want = grads_of(ref_fn, (q.double(), k.double(), v.double()), grad_out.double())
    rtol, _ = OUTPUT_TOLERANCE[dtype]
    for name, g, w, like in zip("qkv", got, want, (q, k, v)):
        assert g.dtype == dtype and g.shape == like.shape, name
        error = (g.double() - w).abs().max().item()
        assert error <= rtol * max(1.0, w.abs().max().item()), (name, error)


@pytest.mark.parametrize("len_q,len_k", LENGTHS)
@pytest.mark.parametrize("d,d_v", DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_matches_reference(dtype, causal, d, d_v, len_q, len_k):
    q, k, v = qkv(2, 4, 2, len_q, len_k, d, d_v, dtype)
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (2, 4, len_q, d_v)
    assert_matches_reference(out, lse, *attention_reference(q, k, v, causal=causal), dtype)


@pytest.mark.parametrize("len_q,len_k", [(1, 33), (113, 70)])
@pytest.mark.parametrize("d,d_v", DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_match_reference(dtype, causal, d, d_v, len_q, len_k):
    q, k, v = qkv(2, 6, 2, len_q, len_k, d, d_v, dtype)  # GQA 3
    check_gradients(lambda a, b, c: ipex_flash.attention(a, b, c, causal=causal),
                    lambda a, b, c: attention_reference(a, b, c, causal=causal)[0],
                    q, k, v, torch.randn(2, 6, len_q, d_v, dtype=dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_attn_func_and_varlen(dtype):
    """flash_attn_func (bottom-right causal, MQA) and flash_attn_varlen_func, forward and
    gradients, against flash-attn's reference per sequence."""
    d, d_v = 192, 128
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    q, k, v = bnhd(2, 37, 90, 4, 1, d, d_v, dtype)
    grad_out = torch.randn(2, 37, 4, d_v, dtype=dtype)
    out = ipex_flash.flash_attn_func(q, k, v, causal=True)
    assert out.shape == (2, 37, 4, d_v)
    torch.testing.assert_close(out.double(), flash_attn_reference(q, k, v, True)[0],
                               rtol=rtol, atol=atol)
    check_gradients(lambda a, b, c: ipex_flash.flash_attn_func(a, b, c, causal=True),
                    lambda a, b, c: flash_attn_reference(a, b, c, True)[0],
                    q, k, v, grad_out, dtype)

    lengths = [(5, 9), (1, 1), (70, 130), (17, 30)]
    seqs = [bnhd(1, nq, nk, 4, 2, d, d_v, dtype) for nq, nk in lengths]
    packed = [torch.cat([s[i][0] for s in seqs]) for i in range(3)]
    cu_q, cu_k = (torch.tensor([0] + [n[i] for n in lengths]).cumsum(0).to(torch.int32)
                  for i in range(2))
    max_q, max_k = (max(n[i] for n in lengths) for i in range(2))
    leaves = [t.clone().requires_grad_() for t in packed]
    out, lse, _ = ipex_flash.flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k,
                                                    causal=True, return_attn_probs=True)
    assert out.shape == (packed[0].shape[0], 4, d_v)
    grad_varlen = torch.randn(out.shape, dtype=dtype)
    out.backward(grad_varlen)
    for b, (q_b, k_b, v_b) in enumerate(seqs):
        rows, keys = (slice(int(cu[b]), int(cu[b + 1])) for cu in (cu_q, cu_k))
        ref_out, ref_lse = flash_attn_reference(q_b, k_b, v_b, True)
        torch.testing.assert_close(out[rows].double(), ref_out[0], rtol=rtol, atol=atol)
        finite = ~torch.isneginf(ref_lse[0])
        torch.testing.assert_close(lse[:, rows].double()[finite], ref_lse[0][finite],
                                   rtol=LSE_TOLERANCE[0], atol=LSE_TOLERANCE[1])
        want = grads_of(lambda a, b, c: flash_attn_reference(a, b, c, True)[0],
                        (q_b.double(), k_b.double(), v_b.double()),
                        grad_varlen[rows].double()[None])
        for leaf, part, w in zip(leaves, (rows, keys, keys), want):
            error = (leaf.grad[part].double() - w[0]).abs().max().item()
            assert error <= rtol * max(1.0, w.abs().max().item()), error


@pytest.mark.parametrize("new_tokens,paged", [(1, False), (1, True), (3, True), (20, False)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kvcache(dtype, new_tokens, paged):
    """flash_attn_with_kvcache with a v_cache of its own head dim, appending new k and v: one
    and three new tokens (GQA 4) run the decode kernel, twenty the general one over the cache."""
    batch, heads_q, heads_kv, d, d_v, capacity = 3, 8, 2, 192, 128, 300
    k_cache, _ = make_cache(batch, capacity, heads_kv, d, dtype)
    _, v_cache = make_cache(batch, capacity, heads_kv, d_v, dtype)
    q = torch.randn(batch, new_tokens, heads_q, d, dtype=dtype)
    k_new = torch.randn(batch, new_tokens, heads_kv, d, dtype=dtype)
    v_new = torch.randn(batch, new_tokens, heads_kv, d_v, dtype=dtype)
    seqlens = torch.tensor([0, 17, 250], dtype=torch.int32)
    table = None
    caches = (k_cache, v_cache)
    if paged:
        *caches, table = to_paged(k_cache, v_cache, 32)
    out, lse = ipex_flash.flash_attn_with_kvcache(q, *caches, k_new, v_new, cache_seqlens=seqlens,
                                                  block_table=table, causal=True,
                                                  return_softmax_lse=True)
    assert out.shape == (batch, new_tokens, heads_q, d_v)
    for b in range(batch):
        rows = slice(int(seqlens[b]), int(seqlens[b]) + new_tokens)
        k_cache[b, rows], v_cache[b, rows] = k_new[b], v_new[b]
    lengths = (seqlens + new_tokens).tolist()
    check_against_reference(out, lse, q, k_cache, v_cache, lengths, dtype, causal=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_varlen_mixed_batch(dtype):
    """flash_attn_varlen_func over a paged cache: decodes and prefills in one batch."""
    d, d_v, page_size = 192, 128, 16
    lengths = [(1, 40), (30, 70), (1, 1)]
    k_cache, _ = make_cache(len(lengths), 80, 2, d, dtype)
    _, v_cache = make_cache(len(lengths), 80, 2, d_v, dtype)
    k_pages, v_pages, table = to_paged(k_cache, v_cache, page_size)
    q = torch.randn(sum(n for n, _ in lengths), 8, d, dtype=dtype)
    cu_q = torch.tensor([0] + [n for n, _ in lengths]).cumsum(0).to(torch.int32)
    seqused = torch.tensor([n for _, n in lengths], dtype=torch.int32)
    out = ipex_flash.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, None, 30, 80, causal=True,
                                            block_table=table, seqused_k=seqused)
    assert out.shape == (q.shape[0], 8, d_v)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for b, (n_q, n_k) in enumerate(lengths):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref, _ = flash_attn_reference(q[rows][None], k_cache[b:b + 1, :n_k],
                                      v_cache[b:b + 1, :n_k], True)
        torch.testing.assert_close(out[rows].double(), ref[0], rtol=rtol, atol=atol)


def test_sdpa_drop_in_and_override():
    """scaled_dot_product_attention with a 3-D call and a float mask; the override serves it."""
    q, k, v = (t[0] for t in qkv(1, 4, 4, 50, 60, 192, 128, torch.float32))
    mask = torch.randn(50, 60)
    out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.shape == (4, 50, 128)
    ref = sdpa_reference(q[None], k[None], v[None], attn_mask=mask)[0]
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert ipex_flash.sdpa.serves(q, k, v, mask)
    with ipex_flash.sdpa_override():
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), out)


EMULATED = ["emulate", "emulate8"]


# Default tier: MLA's 192/128 in bfloat16 (float16 and the other pairs through the same
# kernels: long tier; the other matrix tests run both dtypes).
@pytest.mark.parametrize("d,d_v", tiered([(192, 128), (64, 128), (40, 72)], [(192, 128)],
                                         multi=True))
@pytest.mark.parametrize("dtype", tiered([torch.float16, torch.bfloat16], [torch.bfloat16]))
@pytest.mark.parametrize("mode", EMULATED)
def test_matrix_kernels_emulated(monkeypatch, mode, dtype, d, d_v):
    """The matrix forward (and its K/V pack), the matrix backward (and its packs) and the
    decode kernel's matrix scores, with joint_matrix emulated (runs on any machine)."""
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    name = str(dtype).removeprefix("torch.")
    # The tiles in registers where PVC, BMG and Lunar Lake (emulate) and DG2 and Arrow Lake-H
    # (emulate8) keep them: head dims up to 128 for the forward, dQ and dK/dV; the SLM-staged
    # kernels past them (MLA's 192/128 in the backward).
    for family, registers_header, staged_header, widest in (
            ("forward", "programs/flash_fwd_matrix_registers.hpp", "programs/flash_fwd_matrix.hpp", 128),
            ("backward", "programs/flash_bwd_dkdv_registers.hpp", "programs/flash_bwd_matrix.hpp", 128)):
        plan = C.plan(family, "", name, max(d, d_v), 0, 1, mode)
        registers = plan["variant"].head_dim <= widest
        assert plan["variant"].matrix_m > 0 and plan["variant"].matrix_registers == registers
        assert plan["header"] == (registers_header if registers else staged_header), plan
    q, k, v = qkv(2, 4, 2, 77, 130, d, d_v, dtype)
    for causal in (False, True):
        out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
        assert_matches_reference(out, lse, *attention_reference(q, k, v, causal=causal), dtype)
    check_gradients(lambda a, b, c: ipex_flash.attention(a, b, c, causal=True),
                    lambda a, b, c: attention_reference(a, b, c, causal=True)[0],
                    q, k, v, torch.randn(2, 4, 77, d_v, dtype=dtype), dtype)
    if mode == "emulate":  # decode's matrix scores take N = 16 only
        k_cache, _ = make_cache(2, 200, 2, d, dtype)
        _, v_cache = make_cache(2, 200, 2, d_v, dtype)
        q1 = torch.randn(2, 1, 8, d, dtype=dtype)
        out, lse = ipex_flash.flash_attn_with_kvcache(q1, k_cache, v_cache,
                                                      cache_seqlens=torch.tensor(
                                                          [150, 37], dtype=torch.int32),
                                                      return_softmax_lse=True)
        check_against_reference(out, lse, q1, k_cache, v_cache, [150, 37], dtype)


def test_opcheck_and_compile():
    """Fake implementations give the output's shape (v's head dim) and dv v's shape, so
    opcheck and a fullgraph torch.compile training step agree with eager."""
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 19, 23, 48, 24, torch.float32))
    torch.library.opcheck(torch.ops.ipex_flash.attention_forward.default, (q, k, v),
                          dict(causal=True))
    out, lse = torch.ops.ipex_flash.attention_forward(q, k, v, True)
    torch.library.opcheck(torch.ops.ipex_flash.attention_backward.default,
                          (torch.randn(out.shape), q.detach(), k.detach(), v.detach(),
                           out.detach(), lse), dict(causal=True))
    fq, fk, fv = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.ipex_flash.flash_attn_forward.default,
                          (fq, fk, fv, None, None, 0, 0, None, True, -1, -1, 0.0, None, 0.0, None))
    torch.library.opcheck(torch.ops.ipex_flash.kvcache_attention.default,
                          (fq.detach()[:, :1], fk.detach(), fv.detach(),
                           torch.tensor([23], dtype=torch.int32), None, None, True, -1, -1, 0.0,
                           None))

    def step(a, b, c):
        return (torch.ops.ipex_flash.attention(a, b, c, causal=True) ** 2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    grads = [grads_of(fn, (q, k, v), torch.tensor(1.0)) for fn in (compiled, step)]
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_bad_head_dims_are_named():
    q, k, v = qkv(1, 2, 2, 10, 12, 64, 32, torch.float32)
    k48 = torch.randn(1, 2, 12, 48)
    with pytest.raises(ValueError, match=r"k\.shape\[3\] \(head_dim\) is 48, q's is 64"):
        ipex_flash.attention(q, k48, v)
    with pytest.raises(ValueError, match=r"v's head_dim \(v\.shape\[3\]\) must be in \[1, 512\], "
                                         r"got 513"):
        ipex_flash.attention(q, k, torch.randn(1, 2, 12, 513))
    with pytest.raises(ValueError, match=r"key's head dim \(last dimension\) must equal query's "
                                         r"\(64\), got 48"):
        ipex_flash.scaled_dot_product_attention(q, k48, v)
    with pytest.raises(ValueError, match=r"k\.shape\[3\] \(head_dim\) is 48, q's is 64"):
        ipex_flash.flash_attn_func(*(t.transpose(1, 2) for t in (q, k48, v)))
    with pytest.raises(ValueError, match=r"v_cache must have k_cache's shape but for the head "
                                         r"dim, \(1, 12, 2\), got \(1, 11, 2, 32\)"):
        ipex_flash.flash_attn_with_kvcache(q.transpose(1, 2), k.transpose(1, 2),
                                           torch.randn(1, 11, 2, 32))
    out, lse = torch.ops.ipex_flash.attention_forward(q, k, v)
    with pytest.raises(ValueError, match=r"grad_out must have the output's shape "
                                         r"\(1, 2, 10, 32\)"):
        torch.ops.ipex_flash.attention_backward(torch.randn(1, 2, 10, 64), q, k, v, out, lse)
    views = [launch.view(t) for t in (q, k48, v)]
    with pytest.raises(ValueError, match=r"k's head dim \(48\) must equal q's \(64\)"):
        C.flash_fwd(*views, launch.view(torch.empty(1, 2, 10, 32)), launch.view(torch.empty(1, 2, 10)),
                    launch.view(torch.empty(0, dtype=torch.uint8)), sdpa_options(q, False, None,
                                                                                  0.0, None), 0)
