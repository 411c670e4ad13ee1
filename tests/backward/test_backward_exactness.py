"""The backward recomputes exactly the probabilities the forward used. With one visible key a
row's probability is exactly 1 and its output exactly V; the backward must find P = 1 too, at
any logit, so dV is dO summed over the rows that see the key, rounded once (and, with one
such row in float32, dO itself). The LSE the kernels keep is in their exp2 domain, and the
backward makes each score in the forward's order of operations (flash_bwd.hpp); a round trip
through the natural log, or a score summed in another order, misses 1 by an error that grows
with the logit (5e-5 at 165 in float32).

Cases: the vector kernels (float32, 16-bit) and the matrix kernels emulated in both widths
(16-bit); plain, softcap, ALiBi and, where P < 1, sinks against the float64 reference."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C

from helpers.cases import tiered

LOGITS = (-200.0, 200.0)
SOFTCAP = 0.5 * LOGITS[1]  # large enough that capped logits still span a wide range


def toward_logits(k: torch.Tensor, logits: torch.Tensor, scale: float, dtype) -> torch.Tensor:
    """q (..., N, D) whose rows meet the one key k (..., 1, D) at about the given logits
    (scale * q.k; rounding to dtype moves them a little): k's direction times the logit plus
    noise, so every element is an ordinary number of the dtype."""
    k64 = k.double()
    along = logits.double()[..., None] / (scale * (k64 * k64).sum(-1, keepdim=True)) * k64
    return (along + 0.25 * torch.randn(along.shape, dtype=torch.float64)).to(dtype)


def exact_grad_out(shape, dtype) -> torch.Tensor:
    """dO with |elements| in [1/4, 2): a sum of fewer than 2^11 of them is exact in float32
    (multiples of 2^-12 below 2^12), so the kernels' float32 dV is the exact sum, rounded
    once, and only the probabilities can make it differ from the float64 one."""
    magnitude = torch.empty(shape, dtype=torch.float64).uniform_(0.25, 2.0)
    sign = torch.randint(0, 2, shape, dtype=torch.float64) * 2 - 1
    return (sign * magnitude).to(dtype)


def one_key_grads(q, k, v, grad_out, scale, **options):
    """flash_attn_func's dV (layout (B, N, H, D)) with the key seen by every row, and the
    natural-log LSE it returned."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse, _ = ipex_flash.flash_attn_func(q, k, v, softmax_scale=scale,
                                             return_attn_probs=True, **options)
    out.backward(grad_out)
    return out, lse, v.grad


def rows_summed(grad_out: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """dO (B, N, Hq, D) summed over the rows (and grouped heads) of each K/V head, in float64,
    then rounded once: dV of a key every row sees with probability 1."""
    batch, _, heads_q, dim = grad_out.shape
    grouped = grad_out.double().reshape(batch, -1, heads_kv, heads_q // heads_kv, dim)
    return grouped.sum(dim=(1, 3)).unsqueeze(1).to(grad_out.dtype)


def one_key_inputs(batch, len_q, heads_q, heads_kv, dim, dtype, scale):
    k = torch.randn(batch, 1, heads_kv, dim).to(dtype)
    v = torch.randn(batch, 1, heads_kv, dim).to(dtype)
    logits = torch.linspace(*LOGITS, batch * len_q * heads_q)[torch.randperm(batch * len_q * heads_q)]
    k_per_q = k.transpose(1, 2).repeat_interleave(heads_q // heads_kv, dim=1)  # (B, Hq, 1, D)
    q = toward_logits(k_per_q, logits.view(batch, heads_q, len_q), scale, dtype).transpose(1, 2)
    return q.contiguous(), k, v


def test_float32_one_row_per_key_gives_dv_equal_to_grad_out():
    # Every (batch, head) has one query row and one key: dV must be dO itself, bit for bit,
    # whatever the logit. q (B, H, 1, D) through ipex_flash.attention (the general kernel).
    batch, heads, dim = 4, 8, 40
    for scale in (1.0, 30.0, 1.0 / math.sqrt(dim)):
        k = torch.randn(batch, heads, 1, dim)
        logits = torch.linspace(*LOGITS, batch * heads).view(batch, heads, 1)
        q = toward_logits(k, logits, scale, torch.float32).requires_grad_()
        v = torch.randn(batch, heads, 1, dim, requires_grad=True)
        k.requires_grad_()
        out, lse = ipex_flash.attention(q, k, v, scale=scale, return_lse=True)
        grad_out = torch.randn_like(out)
        out.backward(grad_out)
        assert torch.equal(out, v.detach()), "one key: the output is V exactly"
        assert torch.equal(v.grad, grad_out), (
            f"scale {scale}: dV differs from dO by up to "
            f"{((v.grad - grad_out).abs() / grad_out.abs()).max():.3g} (relative)")
        # The natural-log LSE users see is the score, to float32's rounding of a dot product.
        terms = scale * q.detach().double() * k.detach().double()
        bound = 1e-6 * (terms.abs().sum(-1) + 1.0)
        assert ((lse.double() - terms.sum(-1)).abs() <= bound).all()


# (mode, dtype): the 8-wide matrix form serves bfloat16 only (test_matrix_backward.py).
KERNELS_16BIT = [("vector", torch.float16), ("vector", torch.bfloat16),
                 ("emulate", torch.float16), ("emulate", torch.bfloat16),
                 ("emulate8", torch.bfloat16)]


# Softcap and ALiBi change the scores, which one key leaves at P = 1: the default tier runs
# them on the 16-wide bfloat16 matrix kernels, the long tier on every kernel.
ONE_KEY_CASES = tiered([(mode, dtype, feature) for feature in ("plain", "softcap", "alibi")
                        for mode, dtype in KERNELS_16BIT],
                       [*((mode, dtype, "plain") for mode, dtype in KERNELS_16BIT),
                        *(("emulate", torch.bfloat16, feature)
                          for feature in ("softcap", "alibi"))], multi=True)


@pytest.mark.parametrize("mode,dtype,feature", ONE_KEY_CASES)
def test_16bit_one_key_dv_is_grad_out_summed_and_rounded_once(monkeypatch, dtype, mode, feature):
    heads_q, heads_kv, dim = 6, 2, 64
    monkeypatch.setenv("IPEX_FLASH_MATRIX", "0" if mode == "vector" else mode)
    features = {"plain": 0, "softcap": 1, "alibi": 2}[feature]
    name = str(dtype).removeprefix("torch.")
    for family in ("forward", "backward"):
        plan = C.plan(family, "", name, dim, features, 1, "0" if mode == "vector" else mode)
        assert (plan["variant"].matrix_m > 0) == (mode != "vector"), (family, plan)
    scale = 1.0 / math.sqrt(dim)
    q, k, v = one_key_inputs(2, 53, heads_q, heads_kv, dim, dtype, scale)
    options = {}
    if feature == "softcap":
        options["softcap"] = SOFTCAP
    if feature == "alibi":
        options["alibi_slopes"] = torch.rand(2, heads_q)
    grad_out = exact_grad_out(q.shape, dtype)
    out, _, dv = one_key_grads(q, k, v, grad_out, scale, **options)
    expected_out = v.repeat_interleave(heads_q // heads_kv, dim=2).expand_as(out)
    assert torch.equal(out, expected_out), "one key: the output is V exactly"
    wrong = dv != rows_summed(grad_out, heads_kv)
    assert not wrong.any(), f"{int(wrong.sum())} of {dv.numel()} dV elements not the rounded sum"


def test_flash_attn_func_339_rows_one_key_float16():
    # The shape the defect showed in: 4 of 1536 dV elements were one rounding step off.
    q, k, v = one_key_inputs(1, 339, 12, 12, 128, torch.float16, 1.0 / math.sqrt(128))
    grad_out = exact_grad_out(q.shape, torch.float16)
    _, _, dv = one_key_grads(q, k, v, grad_out, None)
    wrong = dv != rows_summed(grad_out, 12)
    assert not wrong.any(), f"{int(wrong.sum())} of {dv.numel()} dV elements not the rounded sum"


@pytest.mark.parametrize("mode,dtype", [("vector", torch.float32), ("vector", torch.bfloat16),
                                        ("emulate", torch.bfloat16)])
def test_one_key_with_sinks_matches_reference(monkeypatch, dtype, mode):
    # A sink joins the denominator: P < 1, so no exactness, but large logits must not cost
    # accuracy: every gradient within the dtype's tolerance of the float64 reference.
    monkeypatch.setenv("IPEX_FLASH_MATRIX", "0" if mode == "vector" else mode)
    heads, dim, scale = 4, 32, 1.0 / math.sqrt(32)
    q, k, v = one_key_inputs(2, 37, heads, heads, dim, dtype, scale)
    logits = scale * (q.double() * k.double()).sum(-1)  # (B, N, H)
    # Sinks near the rows' logits, so that neither term of the denominator vanishes.
    sinks = (logits.mean(dim=(0, 1)) + torch.randn(heads, dtype=torch.float64)).float()
    grad_out = torch.randn(q.shape).to(dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + [sinks.clone().requires_grad_()]
    out = ipex_flash.flash_attn_func(*leaves[:3], softmax_scale=scale, sinks=leaves[3])
    out.backward(grad_out)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    rq, rk, rv, rsinks = ref_leaves  # one key: P = exp(s) / (exp(s) + exp(sink)), out = P v
    score = scale * (rq * rk).sum(-1)  # (B, N, H)
    prob = torch.exp(score - torch.logaddexp(score, rsinks.expand_as(score)))
    (prob[..., None] * rv).backward(grad_out.double())
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    # In bfloat16 dq and dk are ill-conditioned here: dS = P (dP - delta) cancels for rows
    # with P near 1, and delta = rowsum(dO * O) reads O rounded to bfloat16; times these
    # rows' large q, that error reaches 4e-2 of max |dk| (as before the LSE was kept in the
    # exp2 domain: a property of delta, not of P). dV and dsinks carry P itself.
    checked = slice(None) if dtype == torch.float32 else slice(2, None)
    for name, got, ref in list(zip(("dq", "dk", "dv", "dsinks"), leaves, ref_leaves))[checked]:
        err = (got.grad.double() - ref.grad).abs().max() / ref.grad.abs().max().clamp_min(1e-30)
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_sequences_of_one_key(dtype):
    # flash_attn_varlen_func (the packed forward): each sequence has one key and 1..40 query
    # rows. dO holds bfloat16 values, whose sums here are exact in float32, so dV is their
    # sum rounded once (in float32: not rounded at all).
    lens_q, heads, dim = [1, 17, 40, 3], 4, 48
    scale = 1.0 / math.sqrt(dim)
    parts = [one_key_inputs(1, n, heads, heads, dim, dtype, scale) for n in lens_q]
    q, k, v = (torch.cat([p[i][0] for p in parts]) for i in range(3))  # (total, H, D)
    grad_out = exact_grad_out(q.shape, torch.bfloat16).to(dtype)
    cu_q = torch.tensor([0] + lens_q, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.arange(len(lens_q) + 1, dtype=torch.int32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = ipex_flash.flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lens_q), 1,
                                            softmax_scale=scale)
    out.backward(grad_out)
    assert torch.equal(out, v.repeat_interleave(torch.tensor(lens_q), dim=0))
    expected = torch.stack([grad_out[a:b].double().sum(0)
                            for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist())]).to(dtype)
    wrong = leaves[2].grad != expected
    assert not wrong.any(), f"{int(wrong.sum())} of {wrong.numel()} dV elements not the sum"
