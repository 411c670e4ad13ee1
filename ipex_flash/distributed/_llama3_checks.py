"""llama3_flash_attn_varlen_func's argument checks (llama3.py): this rank's arguments before
anything is exchanged (bad input raises a ValueError or NotImplementedError naming it), and,
once per arguments and offsets tensors, the offsets' values and the agreement of every
rank's shapes and options, with what dropout needs of the other ranks."""
from __future__ import annotations

import torch.distributed as dist

from ipex_flash.distributed._agreement import agreed
from ipex_flash.distributed._checks import AGREED, shape_signature
from ipex_flash.distributed._comm import check_same, gather_ints
from ipex_flash.distributed._llama3_engine import began_before, placed_groups
from ipex_flash.ops.validation import (
    check_alibi, check_cu_seqlens, check_dropout_p, check_flash_inputs, check_max_seqlen,
    check_scale, check_sinks, check_softcap, check_window)


def check_arguments(fn, q, k, v, cu_q, cu_k, max_q, max_k, stride, k_slice, dropout_p, scale,
                    causal, window_size, softcap, alibi, sinks, group):
    """This rank's arguments (nothing is exchanged to check them); returns the window."""
    check_flash_inputs(fn, q, k, v, True)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{fn}: q and k must hold this rank's same slice of the packed tokens: "
                         f"q has {q.shape[0]}, k {k.shape[0]}")
    check_dropout_p(fn, dropout_p)
    if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1 \
            or k.shape[1] % stride:
        raise ValueError(f"{fn}: heads_k_stride must be a positive int dividing nheads_k = "
                         f"{k.shape[1]}, got {stride!r}")
    world = dist.get_world_size(group)
    if not isinstance(k_slice, slice) or k_slice.step not in (None, 1) or not all(
            isinstance(b, int) for b in (k_slice.start, k_slice.stop)) \
            or not 0 <= k_slice.start <= k_slice.stop <= world * k.shape[0]:
        raise ValueError(f"{fn}: local_k_slice must be a slice(start, stop) of the gathered "
                         f"{world * k.shape[0]} keys (llama3_flash_attn_prepare_cu_seqlens "
                         f"gives it), got {k_slice!r}")
    # Their values are checked once per offsets tensor (agree).
    batch = check_cu_seqlens(fn, "cu_seqlens_q", cu_q, q.shape[0], q.device, values=False)
    if check_cu_seqlens(fn, "cu_seqlens_k", cu_k, k_slice.stop - k_slice.start, q.device,
                        values=False) != batch:
        raise ValueError(f"{fn}: cu_seqlens_k describes {len(cu_k) - 1} sequences, "
                         f"cu_seqlens_q {batch}")
    check_max_seqlen(fn, "max_seqlen_q", max_q)
    check_max_seqlen(fn, "max_seqlen_k", max_k)
    check_scale(fn, scale)
    window = check_window(fn, window_size)
    check_softcap(fn, softcap)
    check_alibi(fn, alibi, batch, q.shape[1], q.device)
    check_sinks(fn, sinks, q.unsqueeze(0).transpose(1, 2))
    return window


def needs_placing(causal, window, alibi, dropout_p) -> bool:
    """Whether the kernels need each call's global positions: dropout's keep-mask is drawn at
    them; and without causal the keys of a rank's last sequence run past its queries, so the
    kernels' own diagonal (each sequence's bottom right) is not the global one that windows
    and ALiBi are measured from. With causal both diagonals are the same."""
    return dropout_p > 0.0 or (not causal and (tuple(window) != (-1, -1) or alibi is not None))


def agree(fn, q, k, v, cu_q, cu_k, stride, k_slice, causal, window, softcap, sinks, group,
          dropout_p=0.0, alibi=None):
    """The offsets' values on this rank, and the agreement of every rank's shapes and options
    (a difference raises the same ValueError on every rank rather than a mismatched
    all_gather): once per arguments and offsets tensors, no collective after (_agreement.py).
    Returns, when the calls need placing (needs_placing), each head group's table
    (placed_groups), from every rank's count of sequences gathered in the same all_gather;
    else None."""
    signature = shape_signature(q, k, v, causal, window, softcap, sinks, True,
                                dropout_p, alibi) + [stride]
    rank, tokens = dist.get_rank(group), q.shape[0]

    def learn():
        check_cu_seqlens(fn, "cu_seqlens_q", cu_q, q.shape[0], q.device)
        check_cu_seqlens(fn, "cu_seqlens_k", cu_k, k_slice.stop - k_slice.start, q.device)
        # Where this rank's sequences sit in the batch needs the earlier ranks' counts.
        mine = [len(cu_q) - 1, began_before(rank, tokens, k_slice.start)]
        gathered = gather_ints(signature + mine, q.device, group)
        check_same(fn, [row[:-2] for row in gathered],
                   ("total_local tokens", *AGREED, "heads_k_stride"))
        if not needs_placing(causal, window, alibi, dropout_p):
            return None
        return placed_groups([tuple(row[-2:]) for row in gathered], rank, tokens,
                             k_slice.start, cu_q.tolist(), cu_k.tolist(), q.shape[1],
                             k.shape[1], stride, q.device)
    return agreed(group, (fn, *signature, k_slice.start, k_slice.stop), (cu_q, cu_k), learn)
