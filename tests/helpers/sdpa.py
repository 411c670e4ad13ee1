"""scaled_dot_product_attention's shapes, masks and gradient check. Shared by
api/test_sdpa.py, matrix/test_matrix_backward.py and tools/test_build_guard.py (which runs the
masked gradient check in a child process)."""
import ipex_flash
import torch
import torch.nn.functional as F
from ipex_flash.reference import sdpa_reference

from helpers.cases import random_qkv

B, HQ, HKV = 2, 4, 2


def mask_of(kind, shape, dtype):
    """A random mask of `shape`: bool (True = take part, ~30 % hidden) or additive float in
    `dtype` (normal values with ~30 % -inf)."""
    keep = torch.rand(shape) > 0.3
    if kind == "bool":
        return keep
    return torch.randn(shape).masked_fill(~keep, float("-inf")).to(dtype)


def grads_of(fn, *inputs):
    leaves = [t.detach().clone().requires_grad_() if t is not None and t.is_floating_point()
              else t for t in inputs]
    out = fn(*leaves)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype)
    out.backward(grad_out)
    return [t.grad if t is not None and t.is_floating_point() else None for t in leaves]


def assert_grads_close(got, ref, sdpa, dtype):
    """The kernel's error against float64 at most twice torch SDPA's at the same precision,
    plus a float32-sized floor (the backward suite's rule)."""
    for name, g, r, s in zip("qkv", got, ref, sdpa):
        assert g.dtype == dtype
        error = (g.double() - r).abs().max().item()
        base = (s.double() - r).abs().max().item()
        assert error <= 2 * base + 1e-5, (name, error, base)


def check_masked_gradients(dtype, kind, causal, head_dim=64):
    """dq, dk, dv under a bool or float mask with a hidden block, by the backward's rule."""
    q, k, v = random_qkv(B, HQ, HKV, 70, 150, head_dim, dtype)
    mask = mask_of(kind, (B, 1, 70, 150), torch.float32 if kind == "float32" else dtype)
    mask[..., 100:] = False if kind == "bool" else float("-inf")  # a hidden block
    ours = grads_of(lambda a, b, c: ipex_flash.scaled_dot_product_attention(
        a, b, c, attn_mask=mask, is_causal=causal, enable_gqa=True), q, k, v)
    ref = grads_of(lambda a, b, c: sdpa_reference(a, b, c, mask, causal), q.double(), k.double(),
                   v.double())
    sdpa = grads_of(lambda a, b, c: F.scaled_dot_product_attention(
        a, b, c, attn_mask=mask if kind == "bool" else mask.to(dtype), is_causal=causal,
        enable_gqa=True), q, k, v)
    assert_grads_close(ours, ref, sdpa, dtype)
