"""The ipex_flash operators, registered with torch.library. Layout (B, H, N, D), as in
torch.nn.functional.scaled_dot_product_attention.

    ipex_flash::attention(q, k, v, causal, scale, dropout_p, deterministic) -> out
        Composite: it draws the dropout seed and calls attention_forward, so autograd, fake
        tensors and torch.compile all come from the ops below.
    ipex_flash::attention_forward(q, k, v, causal, scale, dropout_p, dropout_seed,
                                  deterministic, attn_mask, sinks) -> (out, lse)
        The forward kernel (the decode kernel for few query rows per K/V head, unless a
        gradient is wanted); lse is in the kernels' exp2 domain (launch.natural_lse);
        differentiable in q, k, v through attention_backward, and in sinks and a float
        attn_mask through ops/score_grads.py.
    ipex_flash::attention_backward(grad_out, q, k, v, out, lse, ...) -> (dq, dk, dv)
        The backward kernels, lse as attention_forward returned it.
    ipex_flash::dropout_mask(dropout_seed, shape, dropout_p) -> keep (uint8)
        The keep-mask the kernels apply for a seed, for tests (small shapes).

CPU tensors run on the SYCL CPU device, XPU tensors on their stream's SYCL queue. The forward
itself (options, outputs, checks, the kernels' call) is in ops/attention_forward.py, which the
launch plans of ops/fast_path.py share.
"""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash._runtime import C
from ipex_flash.ops import fast_path, score_grads
from ipex_flash.ops.attention_forward import (
    attention_forward_impl, check_forward, forward_outputs, sdpa_options)
from ipex_flash.ops.launch import (
    draw_dropout_seed, dropout_params, flash_bwd, nothing_to_attend, view,
    with_contiguous_last_dim)
from ipex_flash.ops.validation import check_backward_inputs, check_dropout, softmax_scale

Tensor = torch.Tensor
_FN = "ipex_flash.attention"



attention_forward = torch.library.custom_op(
    "ipex_flash::attention_forward", attention_forward_impl, mutates_args=(),
    device_types=("cpu", "xpu"))


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, causal=False, scale=None, dropout_p=0.0, dropout_seed=None,
                            deterministic=False, attn_mask=None, sinks=None, softcap=0.0):
    check_forward(q, k, v, scale, dropout_p, dropout_seed, attn_mask, sinks, softcap)
    return forward_outputs(with_contiguous_last_dim(q), v)


def _gradients_like(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv in the dtype and layout of q, k, v (after the last-dim fix-up)."""
    return tuple(torch.empty_like(with_contiguous_last_dim(t)) for t in (q, k, v))


@torch.library.custom_op("ipex_flash::attention_backward", mutates_args=(),
                         device_types=("cpu", "xpu"))
def attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                       lse: Tensor, causal: bool = False, scale: Optional[float] = None,
                       dropout_p: float = 0.0, dropout_seed: Optional[Tensor] = None,
                       deterministic: bool = False,
                       attn_mask: Optional[Tensor] = None,
                       softcap: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    # deterministic: every kernel already sums in a fixed order (dK/dV per K block, dQ in its
    # own pass, no atomics), so both settings give bitwise-reproducible gradients. Sinks need
    # nothing here: the LSE the forward kept includes them.
    check_forward(q, k, v, scale, dropout_p, dropout_seed, attn_mask, None, softcap)
    check_backward_inputs(_FN, grad_out, out, lse, q, v)
    q, k, v, out, grad_out = (with_contiguous_last_dim(t) for t in (q, k, v, out, grad_out))
    lse = lse.contiguous()  # passed by address: must stay referenced through the launch
    dq, dk, dv = _gradients_like(q, k, v)
    if nothing_to_attend(q, k):  # no row saw a key: nothing depends on q, k or v
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    flash_bwd(view(q), view(k), view(v), view(out), view(grad_out),
              view(lse), view(dq), view(dk), view(dv), view(delta),
              sdpa_options(q, causal, scale, dropout_p, dropout_seed, attn_mask, None, softcap),
              q.device)
    return dq, dk, dv


@attention_backward.register_fake
def _attention_backward_fake(grad_out, q, k, v, out, lse, causal=False, scale=None,
                             dropout_p=0.0, dropout_seed=None, deterministic=False,
                             attn_mask=None, softcap=0.0):
    check_forward(q, k, v, scale, dropout_p, dropout_seed, attn_mask, None, softcap)
    check_backward_inputs(_FN, grad_out, out, lse, q, v)
    return _gradients_like(q, k, v)


def _setup_context(ctx, inputs, output):
    (q, k, v, causal, scale, dropout_p, dropout_seed, deterministic, attn_mask, sinks,
     softcap) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, dropout_seed, attn_mask, sinks)
    ctx.causal, ctx.scale, ctx.dropout_p, ctx.deterministic = causal, scale, dropout_p, deterministic
    ctx.softcap = softcap
    ctx.wants_mask = attn_mask is not None and attn_mask.requires_grad
    ctx.wants_sinks = sinks is not None and sinks.requires_grad
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    # The LSE is an auxiliary output (marked non-differentiable): its gradient is ignored.
    q, k, v, out, lse, dropout_seed, attn_mask, sinks = ctx.saved_tensors
    dq, dk, dv = torch.ops.ipex_flash.attention_backward(
        grad_out, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.dropout_p, dropout_seed,
        ctx.deterministic, attn_mask, ctx.softcap)
    d_mask = d_sinks = None
    wants_mask, wants_sinks = ctx.wants_mask, ctx.wants_sinks
    if wants_sinks:
        d_sinks = score_grads.sinks_grad(sinks, lse, score_grads.output_delta(grad_out, out))
    if wants_mask:
        if ctx.dropout_p > 0.0:
            raise NotImplementedError(
                "ipex_flash: the gradient of attn_mask with dropout_p > 0 is not implemented")
        d_mask = score_grads.attn_mask_grad(q, k, v, grad_out, lse, attn_mask, ctx.causal,
                                            softmax_scale(ctx.scale, q.shape[-1]), ctx.softcap)
    return dq, dk, dv, None, None, None, None, None, d_mask, d_sinks, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("ipex_flash::dropout_mask", mutates_args=(), device_types=("cpu",))
def dropout_mask(dropout_seed: Tensor, shape: list[int], dropout_p: float) -> Tensor:
    """keep (B, H, Nq, Nk) uint8: 1 where attention_forward with this seed keeps P."""
    check_dropout("ipex_flash.dropout_mask", dropout_p, dropout_seed)
    keep = torch.empty(shape, dtype=torch.uint8)
    C.dropout_mask(view(keep), dropout_params(dropout_p, dropout_seed), 0)
    return keep


_lib = torch.library.Library("ipex_flash", "FRAGMENT")
_lib.define("attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, "
            "float dropout_p=0.0, bool deterministic=False) -> Tensor")


def _attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
               scale: Optional[float] = None, dropout_p: float = 0.0,
               deterministic: bool = False) -> Tensor:
    if dropout_p == 0.0 and not fast_path.needs_dispatcher(q, k, v):
        # The launch plan of this signature (the op's own dispatch is then all the host time
        # a small call has left), made after attention_forward has checked a first call.
        return fast_path.sdpa(q, k, v, None, causal, scale, True, 0.0, None, lambda: (
            torch.ops.ipex_flash.attention_forward(q, k, v, causal, scale)[0]))
    seed = draw_dropout_seed(q.device) if dropout_p > 0.0 else None
    return torch.ops.ipex_flash.attention_forward(q, k, v, causal, scale, dropout_p, seed,
                                                  deterministic)[0]


_lib.impl("attention", _attention, "CompositeImplicitAutograd")
