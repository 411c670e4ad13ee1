"""What the dropout tests of the distributed functions share: float64 attention with the
keep-mask one process's flash_attn_func / flash_attn_varlen_func draws for a seed, and that
mask. A sharded call must keep exactly these probabilities; one drawn at other (local)
positions or heads keeps another mask, and its error is of the size of the output."""
from helpers import distributed_cases as dc
import torch

from ipex_flash.ops import launch
from ipex_flash.reference import flash_visibility

SEED = 1234
P = 0.25


def keep_mask(shape, p=P):
    """The keep-mask (batch, heads, rows, keys) of one process's call after
    torch.manual_seed(SEED): the seed it draws, the mask the kernels draw from it."""
    torch.manual_seed(SEED)
    seed = launch.draw_dropout_seed(torch.device("cpu"))
    keep = torch.ops.ipex_flash.dropout_mask(seed, list(shape), p)
    assert 0.6 < keep.float().mean().item() < 0.9  # the mask drops about p of the pairs
    return keep


def reference(q, k, v, keep, causal, window, slopes, dtype, p=P):
    """dc.reference with the keep-mask applied to the probabilities (scaled by 1 / (1 - p))."""
    q, k, v = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    distance, visible = flash_visibility(q.shape[2], k.shape[2], causal, window)
    if slopes is not None:
        per_batch = slopes.view(-1 if slopes.dim() == 2 else 1, slopes.shape[-1], 1, 1)
        scores = scores - per_batch.to(dtype) * distance.abs().to(dtype)
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return (probs * keep.to(dtype) / (1 - p) @ v).transpose(1, 2)


def references(q, k, v, keep, grad_out, dtype, causal, window, slopes, cu=None, p=P):
    """{precision: [out, dq, dk, dv]}; with cu, packed sequences, keep (B, H, max, max)."""
    wants = {}
    for precision in (torch.float64, dtype):
        ref = dc._leaves(*(t.to(precision) for t in (q, k, v)))
        if cu is None:
            out = reference(*ref, keep, causal, window, slopes, precision, p)
        else:
            bounds = list(zip(cu.tolist(), cu.tolist()[1:]))
            out = torch.cat([reference(*(t[a:e].unsqueeze(0) for t in ref),
                                       keep[b:b + 1, :, :e - a, :e - a], causal, window, slopes,
                                       precision, p)[0] for b, (a, e) in enumerate(bounds)])
        out.backward(grad_out.to(precision))
        wants[precision] = [out] + [t.grad for t in ref]
    return wants
