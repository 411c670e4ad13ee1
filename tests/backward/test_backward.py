"""Gradients of the SYCL backward kernels against float64 autograd through the reference.

Pass rule (as flash-attn's tests): the kernel's gradient error against the float64 truth may
be at most twice the error of torch's own SDPA backward run at the same precision, plus a
float32-sized floor."""
import pytest
import torch

import ipex_flash
from ipex_flash.reference import attention_reference

from helpers.backward import (HEAD_DIMS, LENGTHS, check_gradients,
                              check_transposed_layout_and_scale, gradients)
from helpers.cases import DTYPES, random_qkv, tiered


# Default tier: an odd and the common head dim (the smallest and largest, and the rest: long
# tier; test_value_head_dim runs 192); the long tier all.
@pytest.mark.parametrize("len_q,len_k", tiered(LENGTHS, [(1, 1), (17, 1), (127, 127), (200, 77)],
                                               multi=True))
@pytest.mark.parametrize("head_dim", tiered(HEAD_DIMS, [59, 128]))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_match_reference(dtype, causal, head_dim, len_q, len_k):
    check_gradients(*random_qkv(2, 2, 2, len_q, len_k, head_dim, dtype), causal, dtype)


@pytest.mark.parametrize("heads_q,heads_kv", [(4, 2), (6, 1), (8, 2)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_grouped_query_heads(dtype, causal, heads_q, heads_kv):
    """dK and dV of a shared K/V head sum over its query heads."""
    check_gradients(*random_qkv(2, heads_q, heads_kv, 90, 70, 64, dtype), causal, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_transposed_layout_and_scale(dtype):
    check_transposed_layout_and_scale(dtype)


def test_gradients_long_sequence():
    check_gradients(*random_qkv(1, 2, 1, 700, 900, 64, torch.float32), True, torch.float32)


def test_op_gradient_through_torch_ops():
    """torch.ops.ipex_flash.attention (SDPA's signature) is differentiable too."""
    q, k, v = random_qkv(1, 2, 2, 30, 30, 32, torch.float32)
    grad_out = torch.randn(q.shape)
    _, grads = gradients(lambda a, b, c: torch.ops.ipex_flash.attention(a, b, c, causal=True),
                         q, k, v, grad_out)
    _, ref = gradients(lambda a, b, c: attention_reference(a, b, c, causal=True)[0],
                       q.double(), k.double(), v.double(), grad_out.double())
    for got, want in zip(grads, ref):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("deterministic", [True, False])
def test_gradients_are_bitwise_reproducible(deterministic):
    q, k, v = random_qkv(2, 8, 2, 200, 200, 64, torch.float32)
    grad_out = torch.randn(q.shape)
    runs = []
    for _ in range(3):
        a, b, c = (t.clone().requires_grad_() for t in (q, k, v))
        ipex_flash.attention(a, b, c, causal=True, deterministic=deterministic).backward(grad_out)
        runs.append((a.grad, b.grad, c.grad))
    for run in runs[1:]:
        for got, first in zip(run, runs[0]):
            assert torch.equal(got, first)


def test_backward_errors():
    q, k, v = random_qkv(1, 2, 2, 10, 10, 32, torch.float32)
    out, lse = torch.ops.ipex_flash.attention_forward(q, k, v)
    op = torch.ops.ipex_flash.attention_backward
    with pytest.raises(ValueError, match=r"grad_out must have the output's shape \(1, 2, 10, 32\)"):
        op(torch.randn(1, 2, 10, 31), q, k, v, out, lse)
    with pytest.raises(TypeError, match=r"grad_out must have the output's dtype torch.float32"):
        op(torch.randn(1, 2, 10, 32, dtype=torch.float16), q, k, v, out, lse)
    with pytest.raises(ValueError, match=r"lse must be float32 of shape \(1, 2, 10\)"):
        op(torch.randn(1, 2, 10, 32), q, k, v, out, lse[..., :5])
    a = q.clone().requires_grad_()
    with pytest.raises(RuntimeError, match=r"Mismatch in shape"):
        ipex_flash.attention(a, k, v).backward(torch.randn(1, 2, 10, 31))


def test_opcheck_with_gradients():
    for dtype, causal in ((torch.float32, False), (torch.bfloat16, True)):
        q, k, v = (t.requires_grad_() for t in random_qkv(1, 4, 2, 19, 23, 32, dtype))
        torch.library.opcheck(torch.ops.ipex_flash.attention_forward.default, (q, k, v),
                              dict(causal=causal))
        grad_out = torch.randn(q.shape, dtype=dtype)
        out, lse = torch.ops.ipex_flash.attention_forward(q, k, v, causal)
        torch.library.opcheck(torch.ops.ipex_flash.attention_backward.default,
                              (grad_out, q.detach(), k.detach(), v.detach(), out.detach(), lse),
                              dict(causal=causal))


def test_torch_compile_training_step():
    def step(q, k, v):
        out = torch.ops.ipex_flash.attention(q, k, v, causal=True)
        return (out.float() ** 2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    q, k, v = random_qkv(2, 4, 2, 40, 40, 64, torch.float32)
    grads = []
    for fn in (compiled, step):
        a, b, c = (t.clone().requires_grad_() for t in (q, k, v))
        fn(a, b, c).backward()
        grads.append((a.grad, b.grad, c.grad))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
