"""The autograd of the distributed attention ops (_ring_op.py, _varlen_op.py, _llama3_op.py,
_heads_op.py), which share one shape: op(q, k, v, sinks, *rest) -> (out, lse), its backward
op(grad_out, q, k, v, out, lse, sinks, *rest without the forward's own last ones, wants_sinks)
-> (dq, dk, dv, d_sinks). Only q, k, v and sinks take gradients; lse takes none.
"""
from __future__ import annotations

import torch


def register_attention_autograd(op, backward_op, forward_only: int = 0) -> None:
    """Registers op's autograd through backward_op; the last `forward_only` of op's arguments
    (backward_follows) are not the backward's."""

    def setup_context(ctx, inputs, output):
        q, k, v, sinks, *rest = inputs
        rest = rest[:len(rest) - forward_only]
        ctx.tensor_at = [i for i, x in enumerate(rest) if isinstance(x, torch.Tensor)]
        ctx.save_for_backward(q, k, v, *output, sinks, *(rest[i] for i in ctx.tensor_at))
        ctx.rest = [None if i in ctx.tensor_at else x for i, x in enumerate(rest)]
        ctx.untaken = len(inputs) - 4  # the arguments after sinks: no gradient
        ctx.wants_sinks = sinks is not None and sinks.requires_grad
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse, sinks, *tensors = ctx.saved_tensors
        rest = list(ctx.rest)
        for i, tensor in zip(ctx.tensor_at, tensors):
            rest[i] = tensor
        dq, dk, dv, d_sinks = backward_op(grad_out, q, k, v, out, lse, sinks, *rest,
                                          ctx.wants_sinks)
        return (dq, dk, dv, d_sinks if ctx.wants_sinks else None) + (None,) * ctx.untaken

    op.register_autograd(backward, setup_context=setup_context)
