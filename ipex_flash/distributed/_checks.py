"""The checks every distributed entry point makes: its own arguments on each rank (bad input
raises a ValueError/TypeError naming it), then, after one all_gather of each rank's shapes
and options, the agreement between ranks, which every rank sees alike and so raises alike.
Options that do not compose with sharding are refused here, with the reason."""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash.ops.validation import (
    check_alibi, check_dropout_p, check_flash_inputs, check_scale, check_sinks, check_softcap,
    check_window, softmax_scale)

Tensor = torch.Tensor
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# What every rank must agree on, in the order of shape_signature's values after the length.
AGREED = ("batch", "heads of q", "heads of k", "head_dim", "head_dim of v", "dtype", "causal",
          "window_size[0]", "window_size[1]", "softcap", "sinks given", "dropout_p",
          "alibi_slopes given")


def check_local(fn: str, q: Tensor, k: Tensor, v: Tensor, dropout_p, softmax_scale_value,
                window_size, softcap, alibi_slopes, sinks, packed: bool,
                ring: bool = True, placed: bool = False) -> tuple[float, tuple[int, int]]:
    """This rank's arguments; returns (the softmax scale, the window). ring: the kernels
    meet keys by global position block by block (ALiBi and window need it there). placed:
    the layout's blocks are runs of consecutive global positions, at which the kernels draw
    dropout and measure ALiBi (BlockPositions), so both are taken."""
    check_flash_inputs(fn, q, k, v, packed)
    if q.shape[-3] != k.shape[-3]:
        raise ValueError(
            f"{fn}: q and k must hold the same tokens of the sequence (self-attention over a "
            f"sharded sequence): q has {q.shape[-3]} on this rank, k {k.shape[-3]}")
    check_dropout_p(fn, dropout_p)
    if dropout_p > 0.0 and not placed:
        raise NotImplementedError(
            f"{fn}: dropout_p > 0 is not supported: its keep-mask is drawn for four consecutive "
            "global keys at a time, and this layout's keys are not consecutive (ring, zigzag, "
            "their varlen forms, Ulysses, USP and llama3 varlen take dropout)")
    if alibi_slopes is not None and not placed:
        raise NotImplementedError(
            f"{fn}: alibi_slopes is not supported"
            + (": the kernels measure ALiBi's distance between runs of consecutive global "
               "positions, and this layout's tokens are not consecutive (ring, zigzag and "
               "their varlen forms take ALiBi, as does ulysses_flash_attn_func)" if ring
               else ""))
    batch = 1 if packed else q.shape[0]
    check_alibi(fn, alibi_slopes, batch, q.shape[-2], q.device)
    if alibi_slopes is not None and packed and alibi_slopes.dim() == 2:
        raise ValueError(f"{fn}: alibi_slopes must have shape ({q.shape[-2]},) with packed "
                         "sequences")
    check_scale(fn, softmax_scale_value)
    window = check_window(fn, window_size)
    check_softcap(fn, softcap)
    check_sinks(fn, sinks, (q.unsqueeze(0) if packed else q).transpose(1, 2))
    return softmax_scale(softmax_scale_value, q.shape[-1], fn), window


def shape_signature(q: Tensor, k: Tensor, v: Tensor, causal: bool, window: tuple[int, int],
                    softcap: float, sinks: Optional[Tensor], packed: bool,
                    dropout_p: float = 0.0, alibi_slopes: Optional[Tensor] = None) -> list[int]:
    """[local tokens, *AGREED] as ints for the all_gather."""
    batch = 1 if packed else q.shape[0]
    return [q.shape[-3], batch, q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1],
            DTYPE_CODES[q.dtype], int(bool(causal)), window[0], window[1],
            # softcap to 1e-6: enough to tell ranks that pass different values apart
            round(float(softcap) * 1_000_000), int(sinks is not None),
            round(float(dropout_p) * 1_000_000), int(alibi_slopes is not None)]
