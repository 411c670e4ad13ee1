"""Dropout's check: the kernels apply exactly the mask that dropout_mask reports, forward and
backward. Shared by forward/test_dropout.py and matrix/test_matrix_backward.py."""
import math

import ipex_flash  # noqa: F401  (registers the ops; imported before torch, see _runtime.py)
import torch
from ipex_flash.ops import launch

from helpers.cases import random_qkv
from helpers.reference import OUTPUT_TOLERANCE


def reference_with_mask(q, k, v, keep, p, causal):
    """float64 attention with a given keep-mask applied to the probabilities."""
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(),
                                    float("-inf"))
    probs = torch.softmax(scores, dim=-1) * keep.double() / (1 - p)
    return probs @ v


def check_reported_mask(dtype, causal, head_dim=64):
    """The forward's output and the gradients under dropout against the float64 reference
    with the keep-mask dropout_mask reports for the same seed."""
    p = 0.3
    q, k, v = random_qkv(2, 4, 2, 45, 70, head_dim, dtype)
    seed = launch.draw_dropout_seed(q.device)
    keep = torch.ops.ipex_flash.dropout_mask(seed, [2, 4, 45, 70], p)
    a, b, c = (t.clone().requires_grad_() for t in (q, k, v))
    out, _ = torch.ops.ipex_flash.attention_forward(a, b, c, causal, None, p, seed)
    grad_out = torch.randn(out.shape, dtype=dtype)
    out.backward(grad_out)
    a64, b64, c64 = (t.double().requires_grad_() for t in (q, k, v))
    ref = reference_with_mask(a64, b64, c64, keep, p, causal)
    ref.backward(grad_out.double())
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)
    # Gradients are sums over many rows or keys and can reach ~10: the tolerance is relative
    # to each gradient's largest element.
    for got, want in ((a.grad, a64.grad), (b.grad, b64.grad), (c.grad, c64.grad)):
        error = (got.double() - want).abs().max().item()
        assert error <= rtol * max(1.0, want.abs().max().item()), (error, want.abs().max().item())
