"""Empty inputs (no query rows, no keys, an empty batch) behave as torch's SDPA: an output of
the right shape, zeros where a row sees no key, an autograd graph when inputs require grad,
and gradients (zeros) of the inputs' shapes. flash-attn's varlen call with no keys at all
gives zeros with an LSE of -inf (or the sink's logit), as a row that sees no key does."""
import pytest
import torch

import ipex_flash

SDPA = torch.nn.functional.scaled_dot_product_attention

# (query shape, key/value shape), (..., H, L, E) and (..., H, S, E).
EMPTY_SHAPES = {
    "no query rows": ((2, 3, 0, 8), (2, 3, 5, 8)),
    "no keys": ((2, 3, 4, 8), (2, 3, 0, 8)),
    "empty batch": ((0, 3, 4, 8), (0, 3, 5, 8)),
    "leading dims, no query rows": ((1, 1, 1, 0, 1), (1, 1, 1, 3, 1)),
    "leading dims, no keys": ((1, 2, 1, 4, 8), (1, 2, 1, 0, 8)),
    "3-D, no query rows": ((3, 0, 8), (3, 5, 8)),
}


def _leaves(shapes):
    q_shape, kv_shape = shapes
    return [torch.randn(s, requires_grad=True) for s in (q_shape, kv_shape, kv_shape)]


@pytest.mark.parametrize("case", sorted(EMPTY_SHAPES))
def test_sdpa_on_empty_inputs_is_torchs(case):
    q, k, v = _leaves(EMPTY_SHAPES[case])
    expected = SDPA(q, k, v)
    out = ipex_flash.scaled_dot_product_attention(q, k, v)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert torch.equal(out, expected)  # both empty, or both zeros (rows without keys)
    assert out.grad_fn is not None
    grad = torch.randn(out.shape)
    ours = torch.autograd.grad(out, (q, k, v), grad)
    theirs = torch.autograd.grad(expected, (q, k, v), grad)
    for mine, torchs in zip(ours, theirs):
        assert mine.shape == torchs.shape
        assert torch.equal(mine, torchs)


def test_sdpa_without_keys_under_no_grad_and_with_a_mask():
    """The fast path (no grad) and a boolean mask of the empty key dimension."""
    q, k, v = (torch.randn(s) for s in ((2, 4, 3, 16), (2, 2, 0, 16), (2, 2, 0, 16)))
    mask = torch.ones(3, 0, dtype=torch.bool)
    with torch.no_grad():
        out = ipex_flash.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
    assert torch.equal(out, SDPA(q, k, v, mask, enable_gqa=True))
    assert torch.equal(out, torch.zeros(2, 4, 3, 16))


def test_op_without_keys_gives_zeros_and_an_lse_of_minus_infinity():
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 0, 16)
    out, lse = torch.ops.ipex_flash.attention_forward(q, k, k)
    assert torch.equal(out, torch.zeros_like(q))
    assert torch.equal(lse, torch.full((1, 2, 3), float("-inf")))


def test_varlen_with_no_keys_at_all_is_differentiable():
    """Every sequence has zero keys: zeros, LSE -inf, a graph, zero gradients."""
    q = torch.randn(5, 4, 32, requires_grad=True)
    k = torch.randn(0, 2, 32, requires_grad=True)
    v = torch.randn(0, 2, 24, requires_grad=True)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32)
    cu_k = torch.zeros(3, dtype=torch.int32)
    out, lse, _ = ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 0,
                                                    return_attn_probs=True)
    assert out.shape == (5, 4, 24) and out.grad_fn is not None
    assert torch.equal(out, torch.zeros(5, 4, 24))
    assert torch.equal(lse, torch.full((4, 5), float("-inf")))
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn(out.shape))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert not dq.any()


def test_varlen_with_no_keys_and_sinks():
    """A row that sees no key, with a sink: output 0, LSE the sink's logit, and the sink's
    gradient 0 (its probability is 1 and it contributes no value)."""
    q = torch.randn(3, 2, 16, requires_grad=True)
    k = torch.randn(0, 2, 16)
    sinks = torch.randn(2, requires_grad=True)
    cu_q, cu_k = torch.tensor([0, 3], dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    out, lse, _ = ipex_flash.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 0, sinks=sinks,
                                                    return_attn_probs=True)
    assert torch.equal(out, torch.zeros(3, 2, 16))
    # The kernels keep the LSE in the exp2 domain: the logit comes back through one conversion
    # each way, within a float32 rounding of each.
    torch.testing.assert_close(lse, sinks.detach()[:, None].expand(2, 3), rtol=2 ** -22, atol=0)
    d_sinks, = torch.autograd.grad(out, (sinks,), torch.randn(out.shape))
    assert not d_sinks.any()


def test_flash_attn_func_without_keys_or_queries():
    for len_q, len_k in ((4, 0), (0, 6)):
        q = torch.randn(2, len_q, 4, 16, requires_grad=True)
        k = torch.randn(2, len_k, 2, 16, requires_grad=True)
        out = ipex_flash.flash_attn_func(q, k, k, causal=True)
        assert out.shape == q.shape and not out.any() and out.grad_fn is not None
        dq, dk = torch.autograd.grad(out, (q, k), torch.randn(out.shape))
        assert dq.shape == q.shape and dk.shape == k.shape
        assert not dq.any() and not dk.any()


@pytest.mark.parametrize("len_q,len_k", [(4, 0), (0, 5)])
def test_opcheck_on_empty_inputs(len_q, len_k):
    """The fake implementation, autograd registration and schema agree on empty inputs too."""
    q = torch.randn(1, 2, len_q, 16, requires_grad=True)
    k, v = (torch.randn(1, 2, len_k, 16, requires_grad=True) for _ in range(2))
    torch.library.opcheck(torch.ops.ipex_flash.attention_forward.default, (q, k, v))
    bnhd = [t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(torch.ops.ipex_flash.flash_attn_forward.default,
                          (*bnhd, None, None, 0, 0, None, False, -1, -1, 0.0, None, 0.0, None))
