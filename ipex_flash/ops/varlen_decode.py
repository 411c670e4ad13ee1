"""flash_attn_varlen_func's decode steps on the split-KV decode kernel. When every sequence has
the same few queries (one token, or a speculative draft's), the packed keys are read as a KV
cache whose sequence b is rows cu_seqlens_k[b]..cu_seqlens_k[b + 1] of the one (total_k, Hkv,
D) tensor, seen with a batch stride of 0: seqlens_k = cu_seqlens_k[1:] and k_start =
cu_seqlens_k[:-1] (flash-attn's cache_leftpad, whose masks and ALiBi count positions from
k_start, as varlen's count them from each sequence's first key). The general kernel would run a
whole block of query rows per sequence and head for one row, and not split the keys: at 4096
keys, tens of times the decode kernel's work."""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash._runtime import C
from ipex_flash.ops import launch, launch_plans

Tensor = torch.Tensor


def decode_views(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                 cu_seqlens_q: Tensor, max_seqlen_q: int,
                 options: Optional["C.AttentionOptions"] = None,
                 backward_follows: bool = False) -> Optional[tuple[Tensor, ...]]:
    """q, k, v, out (B, H, L, D) and lse (B, Hq, L) views as the decode kernel reads them, of
    packed q, out (total_q, H, D), k, v (total_k, Hkv, D) and lse (Hq, total_q) whose sequences
    are max_seqlen_q = L rows each; None when they are not, or the call does not take the decode
    kernel (C.takes_decode_kernel on the views, with the call's options, none for a call
    without dropout, and backward_follows: L past what it serves, 16-bit rows not word-aligned,
    dropout, a backward to follow). cu_seqlens_q contiguous."""
    batch, length = cu_seqlens_q.shape[0] - 1, max_seqlen_q
    heads_kv = k.shape[1]
    if not (1 <= length and batch * length <= q.shape[0] and heads_kv > 0
            and C.decode_serves_rows(q.shape[1] // heads_kv * length, length, heads_kv)[0]):
        return None  # (the rows the decode kernel serves: asked before making any view)
    rows = batch * length
    q4, out4 = (t[:rows].view(batch, length, *t.shape[1:]).transpose(1, 2) for t in (q, out))
    k4, v4 = (t.expand(batch, *t.shape).transpose(1, 2) for t in (k, v))
    lse4 = lse[:, :rows].view(lse.shape[0], batch, length).transpose(0, 1)
    if not (C.takes_decode_kernel(*(launch.view(t) for t in (q4, k4, v4)),
                                  _NO_OPTIONS if options is None else options, backward_follows,
                                  launch.queue_handle(q.device))
            and launch_plans.uniform_sequences(cu_seqlens_q, batch, length)):
        return None
    return q4, k4, v4, out4, lse4


_NO_OPTIONS = C.AttentionOptions()  # (no dropout, no packed queries)


def as_cache(options: "C.AttentionOptions", cu_seqlens_k: Tensor, max_seqlen_k: int) -> tuple:
    """options (flash_options without cu_seqlens) reading the keys as decode_views' cache;
    returns the tensors they point to, which the caller keeps until the launch has returned."""
    seqlens, starts = cu_seqlens_k[1:], cu_seqlens_k[:-1]
    options.seqlens_k, options.k_start = launch.view(seqlens), launch.view(starts)
    options.max_seqlen_k = max_seqlen_k
    return seqlens, starts


def run(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, options: "C.AttentionOptions",
        cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
        backward_follows: bool = False) -> bool:
    """Runs a checked packed call on the decode kernel and returns True, when its sequences are
    such a step, the call takes that kernel (decode_views: options, flash_options without
    cu_seqlens, with the call's dropout) and each sequence has at least its L keys (so that every
    row sees a key); otherwise launches nothing and returns False."""
    views = decode_views(q, k, v, out, lse, cu_seqlens_q, max_seqlen_q, options,
                         backward_follows)
    if views is None:
        return False
    if int((cu_seqlens_k[1:] - cu_seqlens_k[:-1]).min()) < max_seqlen_q:
        return False
    _kept = as_cache(options, cu_seqlens_k, max_seqlen_k)
    launch.run_forward(*views, options, max_len_k=max_seqlen_k)
    return True
