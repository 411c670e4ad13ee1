"""The backward's gradient rule (as flash-attn's tests): the kernel's gradient error against
the float64 truth may be at most twice the error of torch's own SDPA backward run at the same
precision, plus a float32-sized floor. Shared by backward/test_backward.py and
matrix/test_matrix_backward.py (the matrix-engine backward through the same checks)."""
import ipex_flash
import torch
import torch.nn.functional as F
from ipex_flash.reference import attention_reference

from helpers.cases import random_qkv

FLOOR = 1e-5  # float32 rounding of O(1) gradients

HEAD_DIMS = [16, 59, 64, 96, 128, 256]
LENGTHS = [(1, 1), (17, 1), (1, 33), (127, 127), (113, 203), (200, 77)]


def gradients(fn, q, k, v, grad_out):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(grad_out)
    return out, (q.grad, k.grad, v.grad)


def check_gradients(q, k, v, causal, dtype, scale=None):
    grad_out = torch.randn(q.shape, dtype=dtype)
    out, grads = gradients(lambda a, b, c: ipex_flash.attention(a, b, c, causal=causal, scale=scale),
                           q, k, v, grad_out)
    _, ref_grads = gradients(
        lambda a, b, c: attention_reference(a, b, c, causal=causal, scale=scale)[0],
        q.double(), k.double(), v.double(), grad_out.double())
    _, sdpa_grads = gradients(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal, scale=scale,
                                                       enable_gqa=True),
        q, k, v, grad_out)
    for name, got, ref, sdpa, like in zip("qkv", grads, ref_grads, sdpa_grads, (q, k, v)):
        assert got.dtype == dtype and got.shape == like.shape
        kernel_error = (got.double() - ref).abs().max().item()
        sdpa_error = (sdpa.double() - ref).abs().max().item()
        assert kernel_error <= 2 * sdpa_error + FLOOR, (name, kernel_error, sdpa_error)


def check_transposed_layout_and_scale(dtype):
    """Inputs in (B, N, H, D) memory seen as (B, H, N, D), with a scale: the gradients by the
    rule, and dq in q's layout."""
    q, k, v = random_qkv(2, 4, 2, 77, 100, 80, dtype, layout="bnhd")
    check_gradients(q, k, v, True, dtype, scale=0.2)
    q.requires_grad_()
    ipex_flash.attention(q, k, v).sum().backward()
    assert q.grad.stride() == q.stride(), "dq should come back in q's layout"
