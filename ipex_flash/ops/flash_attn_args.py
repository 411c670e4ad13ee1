"""flash-attn's arguments as the kernels take them (ops/flash_attn.py): the checks of a
call, the kernels' options, and the outputs' shapes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ipex_flash._runtime import C
from ipex_flash.ops import launch
from ipex_flash.ops.validation import (
    check_alibi, check_cu_seqlens, check_dropout, check_flash_inputs, check_sinks, check_softcap,
    check_max_seqlen, check_window, longest_sequence, window_bound)

Tensor = torch.Tensor


def bhnd(t: Tensor, packed: bool) -> Tensor:
    """The kernels' (B, H, N, D) view of a flash-attn tensor, without a copy."""
    return (t.unsqueeze(0) if packed else t).transpose(1, 2)


@dataclass(frozen=True)
class BlockPositions:
    """Where a call's sequences, heads, rows and keys sit in a larger attention, of which it is
    one block (a rank's queries against one K/V shard of a ring): its window (causal: right
    0) and ALiBi are measured from the global diagonal, and dropout draws its keep-mask at
    these global positions (GlobalPositions in sycl_src), so that the blocks together see,
    bias and keep exactly what one call over the whole would."""
    table: Tensor  # int64 on the call's device, as the kernels read it (GlobalPositions)

    @staticmethod
    def of(entries: list[tuple[int, int, int]], device: torch.device, head_offset: int = 0,
           heads_total: int = 0) -> "BlockPositions":
        """entries: one for every sequence, or one per sequence b: (its global sequence minus
        b, the global position of its query row 0, that of its key 0). The call's head 0 is
        global head head_offset of heads_total (0: the call's own heads)."""
        header = [0 if len(entries) == 1 else 3, head_offset, heads_total, 0]
        flat = header + [value for entry in entries for value in entry]
        return BlockPositions(torch.tensor(flat, dtype=torch.int64, device=device))


def flash_options(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale_value,
                   causal, window_left, window_right, softcap, alibi_slopes, dropout_p,
                   dropout_seed, sinks=None,
                   positions: Optional[BlockPositions] = None) -> "C.AttentionOptions":
    """The kernels' options. Tensors are passed by address: the caller keeps them alive (and
    contiguous, see contiguous_extras) until the launch has returned."""
    options = C.AttentionOptions()
    options.scale = softmax_scale_value
    # flash-attn aligns masks to the bottom-right corner; causal is the window (left, 0).
    options.mask = C.MaskParams(window_left=window_bound(window_left),
                                window_right=0 if causal else window_bound(window_right),
                                bottom_right=True)
    options.dropout = launch.dropout_params(dropout_p, dropout_seed)
    options.softcap = softcap
    if alibi_slopes is not None:
        options.alibi_slopes = launch.view(alibi_slopes)
    if sinks is not None:
        options.sinks = launch.view(sinks)
    if cu_seqlens_q is not None:
        options.cu_seqlens_q = launch.view(cu_seqlens_q)
        options.cu_seqlens_k = launch.view(cu_seqlens_k)
        options.max_seqlen_q, options.max_seqlen_k = max_seqlen_q, max_seqlen_k
    if positions is not None:
        options.positions = launch.view(positions.table)
    return options


def contiguous_extras(*tensors: Optional[Tensor]) -> tuple[Optional[Tensor], ...]:
    """cu_seqlens and ALiBi slopes as the kernels read them: dense, in variables that outlive
    the launch."""
    return tuple(None if t is None else t.contiguous() for t in tensors)


def check_call(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left,
           window_right, softcap, alibi_slopes, dropout_p, dropout_seed, sinks=None,
           values: bool = True) -> None:
    """values=False (the fake implementation) skips what reads cu_seqlens' contents."""
    packed = cu_seqlens_q is not None
    check_flash_inputs(fn, q, k, v, packed)
    check_sinks(fn, sinks, bhnd(q, packed))
    if packed:
        batch = check_cu_seqlens(fn, "cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device,
                                 values)
        batch_k = check_cu_seqlens(fn, "cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device,
                                   values)
        if batch_k != batch:
            raise ValueError(f"{fn}: cu_seqlens_k describes {batch_k} sequences, cu_seqlens_q {batch}")
        for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            check_max_seqlen(fn, name, value)
        if values and cu_seqlens_q.device.type != "meta":
            for name, cu, value in (("q", cu_seqlens_q, max_seqlen_q), ("k", cu_seqlens_k, max_seqlen_k)):
                longest = longest_sequence(cu)
                if longest > value:
                    raise ValueError(f"{fn}: a sequence of {name} has {longest} tokens, more than "
                                     f"max_seqlen_{name}={value}")
    else:
        batch = q.shape[0]
    check_window(fn, (window_left, window_right))
    check_softcap(fn, softcap)
    check_alibi(fn, alibi_slopes, batch, q.shape[-2], q.device)
    check_dropout(fn, dropout_p, dropout_seed)


def forward_outputs(q: Tensor, v: Tensor, packed: bool) -> tuple[Tensor, Tensor]:
    lse_shape = (q.shape[1], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1])
    return launch.attention_outputs(launch.with_contiguous_last_dim(q), v.shape[-1], lse_shape)
