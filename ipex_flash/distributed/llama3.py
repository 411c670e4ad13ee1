"""All-gather context parallelism over packed sequences (Llama 3's, ring-flash-attention's
llama3_flash_attn_varlen_func): the packed token stream of a batch is cut into P equal
contiguous slices, one per rank, so a sequence may start on one rank and end on another.
Each rank all-gathers K and V (heads_k_stride K/V heads at a time, the next group travelling
while the current one is computed on) and attends its queries to the keys its sequences
need, local_k_slice of the gathered stream (llama3_layout.py works out those offsets). The
backward gathers K/V again and reduce-scatters dK/dV back to the ranks that own them
(_llama3_engine.py, inside the torch ops of _llama3_op.py, which torch.compile keeps whole).

    cu_q, cu_k, max_q, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(
        cu_seqlens, causal=True, rank=rank, world_size=world)
    out = llama3_flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                        heads_k_stride=1, local_k_slice=k_slice, causal=True)
"""
from __future__ import annotations

import torch

from ipex_flash.distributed import _llama3_op  # noqa: F401  (registers the torch ops)
from ipex_flash.distributed._comm import resolve_group
from ipex_flash.distributed._llama3_checks import check_arguments
from ipex_flash.distributed.llama3_layout import llama3_flash_attn_prepare_cu_seqlens  # noqa: F401
from ipex_flash.ops.launch import draw_dropout_seed, natural_lse
from ipex_flash.ops.validation import softmax_scale as resolve_scale

Tensor = torch.Tensor
__all__ = ["llama3_flash_attn_prepare_cu_seqlens", "llama3_flash_attn_varlen_func",
           "llama3_flash_attn_varlen_kvpacked_func", "llama3_flash_attn_varlen_qkvpacked_func"]


def llama3_flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, heads_k_stride, local_k_slice, dropout_p=0.0,
                                  softmax_scale=None, causal=False, window_size=(-1, -1),
                                  alibi_slopes=None, deterministic=False,
                                  return_attn_probs=False, group=None, *, softcap=0.0,
                                  sinks=None):
    """Attention over packed sequences whose token stream is split into equal contiguous
    slices across the ranks of `group`, by all-gathering K/V.

    Args:
        q: (total_local, nheads, headdim), this rank's slice of the packed queries; k, v:
            (total_local, nheads_k, headdim / headdim_v), the same tokens.
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, local_k_slice: what
            llama3_flash_attn_prepare_cu_seqlens(cu_seqlens, causal, rank, world_size) gives
            (int32 offsets, made with the same causal).
        heads_k_stride: K/V heads gathered at a time (must divide nheads_k): the gathered
            buffers hold P * total_local * heads_k_stride keys, two of them in flight.
        dropout_p: as flash_attn_varlen_func over the whole batch, with the very keep-mask
            it draws: each call is placed at its sequences' indices in the batch and their
            global positions (learned with the ranks' agreement, once per offsets tensor)
            and at its group's first query head. One seed per call from torch's generator:
            seed every rank alike.
        causal: each token sees the tokens of its sequence up to itself, on any rank.
        window_size, alibi_slopes: in positions of the whole sequence, causal or not
            (without causal each call is placed at its sequences' global positions, as for
            dropout). alibi_slopes: (nheads,) or (local batch, nheads) float32, row b for
            this rank's local sequence b (a sequence split across ranks has a row on each).
        softmax_scale, softcap, sinks: as flash_attn_varlen_func. sinks' gradient is this
            rank's part (sum it over the group, as DDP/FSDP do).
        deterministic: accepted; the result is always deterministic.
        return_attn_probs: also return the LSE (nheads, total_local) float32, natural log,
            and None.
        group: the process group (default: the world).

    Returns:
        out (total_local, nheads, headdim_v), or (out, lse, None).
    """
    fn = "ipex_flash.distributed.llama3_flash_attn_varlen_func"
    group = resolve_group(fn, group)
    window = check_arguments(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                             max_seqlen_k, heads_k_stride, local_k_slice, dropout_p,
                             softmax_scale, bool(causal), window_size, softcap, alibi_slopes,
                             sinks, group)
    backward_follows = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, sinks))
    # One draw per call, as flash_attn_varlen_func makes: ranks seeded alike keep what it
    # keeps.
    seed = draw_dropout_seed(q.device) if dropout_p > 0.0 else None
    out, lse = torch.ops.ipex_flash.llama3_attention(
        q, k, v, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride,
        local_k_slice.start, local_k_slice.stop, group.group_name,
        resolve_scale(softmax_scale, q.shape[-1], fn), bool(causal), window[0], window[1],
        float(softcap), alibi_slopes, float(dropout_p), seed, backward_follows)
    return (out, natural_lse(lse), None) if return_attn_probs else out


def _unpack(fn, tensor, count, name):
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4 or tensor.shape[1] != count:
        raise ValueError(f"ipex_flash.distributed.{fn}: {name} must be (total_local, {count}, "
                         f"heads, headdim), got shape {tuple(getattr(tensor, 'shape', ()))}")
    return tensor.unbind(1)


def llama3_flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k, heads_k_stride, local_k_slice,
                                            dropout_p=0.0, softmax_scale=None, causal=False,
                                            window_size=(-1, -1), alibi_slopes=None,
                                            deterministic=False, return_attn_probs=False,
                                            group=None, *, softcap=0.0, sinks=None):
    """llama3_flash_attn_varlen_func with qkv (total_local, 3, nheads, headdim)."""
    q, k, v = _unpack("llama3_flash_attn_varlen_qkvpacked_func", qkv, 3, "qkv")
    return llama3_flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride,
        local_k_slice, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
        deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)


def llama3_flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, heads_k_stride, local_k_slice,
                                           dropout_p=0.0, softmax_scale=None, causal=False,
                                           window_size=(-1, -1), alibi_slopes=None,
                                           deterministic=False, return_attn_probs=False,
                                           group=None, *, softcap=0.0, sinks=None):
    """llama3_flash_attn_varlen_func with kv (total_local, 2, nheads_k, headdim)."""
    k, v = _unpack("llama3_flash_attn_varlen_kvpacked_func", kv, 2, "kv")
    return llama3_flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride,
        local_k_slice, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
        deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)
