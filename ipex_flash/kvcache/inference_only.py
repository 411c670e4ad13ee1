"""The KV-cache and paged serving ops have no backward: their forward serves inputs that need
gradients (a model run with grad mode on), and a backward through them raises an error that
says so and names the differentiable calls to train with, instead of torch's generic "no
autograd formula was registered".

The error comes from an op of its own in the backward, ipex_flash::inference_only_backward,
rather than from the backward function: torch.compile traces a backward ahead of running it
(on fake tensors, where the op's fake returns a gradient's shape), so a compiled forward with
inputs that need gradients still runs, and its backward raises when it runs, as in eager mode.
"""
from __future__ import annotations

from typing import Sequence

import torch

Tensor = torch.Tensor


def no_backward_message(function: str) -> str:
    return (
        f"{function} is an inference op (KV cache, paged serving call) and has no backward. "
        "To train, attend over contiguous keys with a differentiable call: "
        "ipex_flash.flash_attn_func ((batch, seqlen, heads, headdim)), "
        "ipex_flash.flash_attn_varlen_func without block_table (packed sequences with "
        "cu_seqlens_q and cu_seqlens_k), ipex_flash.attention or "
        "ipex_flash.scaled_dot_product_attention ((batch, heads, seqlen, headdim)). "
        "For inference, call it under torch.no_grad() or torch.inference_mode().")


@torch.library.custom_op("ipex_flash::inference_only_backward", mutates_args=())
def inference_only_backward(grad: Tensor, shape: Sequence[int], dtype: torch.dtype,
                            function: str) -> Tensor:
    """The gradient of an input (shape, dtype) of an inference op: never, it raises."""
    raise NotImplementedError(no_backward_message(function))


@inference_only_backward.register_fake
def _inference_only_backward_fake(grad, shape, dtype, function):
    return grad.new_empty(shape, dtype=dtype)


def register_inference_only(op, function: str) -> None:
    """Gives a functional custom op (torch.library.custom_op) a backward that raises, naming
    `function`, the public call that reaches the op."""

    def setup_context(ctx, inputs, output):
        ctx.inputs = [(tuple(t.shape), t.dtype) if isinstance(t, Tensor) else None
                      for t in inputs]

    def backward(ctx, grad, *other_grads):
        # The error is the gradient of the first input that needs one, so that a compiled
        # backward keeps it (a graph drops what no gradient reads).
        wanted = [i for i, needed in enumerate(ctx.needs_input_grad) if needed]
        grads = [None] * len(ctx.needs_input_grad)
        if wanted:
            shape, dtype = ctx.inputs[wanted[0]]
            grads[wanted[0]] = torch.ops.ipex_flash.inference_only_backward(grad, shape, dtype,
                                                                            function)
        return tuple(grads)

    op.register_autograd(backward, setup_context=setup_context)
