"""The property tests' reference and pass rule (flash-attn's): a result's error against float64
may be at most twice the error of the same computation done plainly at the input's precision,
plus a small floor. Both sides come from ipex_flash.reference.sdpa_reference, run in float64
and in the dtype; flash-attn's masks and ALiBi enter it as an additive bias."""
import math

import torch

from ipex_flash.reference import flash_visibility, sdpa_reference

# The floor for float32, relative to the largest true value: float32 kernels accumulate like
# the reference, so their error is rounding, and the plain float32 error can be near zero.
FLOAT32_FLOOR = 1e-5


def flash_bias(len_q, len_k, causal, window, slopes=None):
    """flash-attn's masks and ALiBi as an additive float64 bias (-inf: hidden), broadcastable
    to (B, H, len_q, len_k): query i sits at key position i + len_k - len_q (bottom-right),
    sees keys within window (left, right) of it (causal: right = 0), and ALiBi subtracts
    slope * |distance|. slopes: None, (H,) or (B, H)."""
    distance, visible = flash_visibility(len_q, len_k, causal, window)
    bias = torch.zeros(len_q, len_k, dtype=torch.float64).masked_fill(~visible, -math.inf)
    if slopes is None:
        return bias
    slopes = slopes.double()
    slopes = slopes[:, :, None, None] if slopes.dim() == 2 else slopes[:, None, None]
    return bias - slopes * distance.abs().double()


def attention(q, k, v, dtype, bias=None, softcap=0.0, sinks=None, is_causal=False, scale=None):
    """Attention of q (B, Nq, Hq, D), k, v (B, Nk, Hkv, D) in flash-attn's layout, computed in
    `dtype` (float64: the truth) by sdpa_reference; bias: additive float or bool mask
    broadcastable to (B, Hq, Nq, Nk); is_causal: SDPA's top-left mask. A sequence without keys
    gives zeros. Differentiable in q, k, v and sinks."""
    if k.shape[1] == 0:
        return q.new_zeros(*q.shape[:3], v.shape[3], dtype=dtype) + 0 * q.sum().to(dtype)
    if bias is not None and bias.dtype != torch.bool:
        bias = bias.to(dtype)
    out = sdpa_reference(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=bias,
                         is_causal=is_causal, scale=scale, softcap=softcap, sinks=sinks,
                         compute_dtype=dtype)
    return out.transpose(1, 2)


def _floor(truth, dtype):
    """float32: FLOAT32_FLOOR relative; half types: flash-attn's, twice the rounding error of
    values of the truth's size (truth + 0.3 - 0.3 in the dtype)."""
    if dtype == torch.float32:
        return FLOAT32_FLOOR * max(1.0, truth.abs().max().item())
    rounded = (truth.to(dtype) + 0.3 - 0.3).double()
    return 2 * (rounded - truth).abs().max().item()


def assert_within_rule(name, got, truth, plain, dtype):
    """got (the kernel's, in dtype) against truth (float64) within twice the plain dtype
    computation's error plus the floor; NaN or Inf in got fails."""
    assert got.dtype == dtype, (name, got.dtype)
    assert got.shape == truth.shape, (name, tuple(got.shape), tuple(truth.shape))
    if truth.numel() == 0:
        return
    error = (got.double() - truth).abs().max().item()
    plain_error = (plain.double() - truth).abs().max().item()
    floor = _floor(truth, dtype)
    assert error <= 2 * plain_error + floor, (
        f"{name}: error {error:.3e} against float64 > 2 x {plain_error:.3e} (plain {dtype}) "
        f"+ {floor:.1e}")


def gradients(fn, inputs, grad_out):
    """fn(*leaves) and the gradients of <out, grad_out> (grad_out: a generator draws it) for
    each floating input (None for the rest), with inputs cloned into fresh leaves."""
    leaves = [t.detach().clone().requires_grad_() if _floating(t) else t for t in inputs]
    out = fn(*leaves)
    if isinstance(grad_out, torch.Generator):
        grad_out = torch.randn(out.shape, generator=grad_out, dtype=torch.float64)
    out.backward(grad_out.to(out.dtype))
    # An input the output does not depend on (sinks of a batch whose queries see no key) has
    # a zero gradient.
    grads = [None if not _floating(t) else torch.zeros_like(t) if t.grad is None else t.grad
             for t in leaves]
    return out.detach(), grads, grad_out


def check_against_rule(kernel_fn, reference_fn, inputs, names, dtype, backward, generator):
    """kernel_fn(*inputs) against reference_fn(*inputs, dtype) (float64 truth, dtype baseline):
    the output and, with backward, the gradient of each input named in names (None: not
    checked). Inputs are the differentiable tensors; everything else the functions close over."""
    truth_inputs = [t.double() if _floating(t) else t for t in inputs]
    if not backward:
        with torch.no_grad():
            got = kernel_fn(*inputs)
            truth = reference_fn(*truth_inputs, torch.float64)
            plain = reference_fn(*inputs, dtype)
        assert_within_rule("out", got, truth, plain, dtype)
        return
    got, got_grads, grad_out = gradients(kernel_fn, inputs, generator)
    truth, truth_grads, _ = gradients(lambda *t: reference_fn(*t, torch.float64), truth_inputs,
                                      grad_out)
    plain, plain_grads, _ = gradients(lambda *t: reference_fn(*t, dtype), inputs, grad_out)
    assert_within_rule("out", got, truth, plain, dtype)
    for name, g, t, p, x in zip(names, got_grads, truth_grads, plain_grads, inputs):
        if name is None:
            continue
        assert g is not None, f"d{name}: no gradient"
        # A gradient has its input's dtype (sinks are float32 whatever q's dtype).
        assert_within_rule(f"d{name}", g, t, p, x.dtype)


def _floating(t):
    return isinstance(t, torch.Tensor) and t.is_floating_point()
