"""The serving call: flash_attn_varlen_func over a paged KV cache (block_table), the call
vLLM's and SGLang's attention backends make each step, with prefills, chunked prefills and
single-token decodes mixed in one batch.

One op, ipex_flash::paged_varlen_attention. Sequences with a few new tokens (decodes,
speculative drafts: at most C.max_sliced_decode_tokens) run the split-KV decode kernel (where it
serves the cache: launch.run_forward), gathered into a dense batch per length; the rest run the
general kernel over their own packed queries and the paged cache. Masks are aligned
bottom-right per sequence (new token i of a sequence with L keys sits at position
L - len_q + i)."""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash._runtime import C
from ipex_flash.kvcache import fast_calls, fp8_quant
from ipex_flash.kvcache.cache_ops import cache_options
from ipex_flash.kvcache.checks import check_block_table_entries, check_page_size
from ipex_flash.kvcache.inference_only import register_inference_only
from ipex_flash.ops import launch
from ipex_flash.ops.fast_path import needs_dispatcher
from ipex_flash.ops.validation import (
    check_alibi, check_attention_inputs, check_cu_seqlens, check_dropout_p, check_max_seqlen,
    check_scale, check_sinks, check_window)
from ipex_flash.ops.validation import softmax_scale as resolve_scale

Tensor = torch.Tensor
_FN = "ipex_flash.flash_attn_varlen_func"


def _check(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
           max_seqlen_k, alibi_slopes, sinks, values: bool = True) -> tuple[int, bool]:
    """Checks the call, returns the batch and whether the cache is FP8; values=False (fake
    tensors, torch.compile) skips what needs the tensors' contents."""
    if not isinstance(q, Tensor) or q.dim() != 3:
        raise ValueError(f"{_FN}: with block_table, q must be (total_q, nheads, headdim)")
    for name, t in (("k", k_cache), ("v", v_cache)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{_FN}: with block_table, {name} must be a paged cache "
                             "(num_blocks, page_size, nheads_k, headdim)")
    if v_cache.shape[:3] != k_cache.shape[:3]:  # its head dim may differ
        raise ValueError(f"{_FN}: v must have k's shape but for the head dim, "
                         f"{tuple(k_cache.shape[:3])}, got {tuple(v_cache.shape)}")
    check_page_size(k_cache)
    if values:
        batch = check_cu_seqlens(_FN, "cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device)
    else:
        batch = cu_seqlens_q.shape[0] - 1
    for name, t, shape in (("block_table", block_table, (batch, -1)),
                           ("seqused_k", seqused_k, (batch,))):
        if not isinstance(t, Tensor) or t.dtype != torch.int32:
            raise TypeError(f"{_FN}: {name} must be an int32 tensor")
        if t.dim() != len(shape) or t.shape[0] != batch or t.device != q.device:
            raise ValueError(f"{_FN}: {name} must have shape {shape} (-1: any) on {q.device}, "
                             f"got {tuple(t.shape)} on {t.device}")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        check_max_seqlen(_FN, name, value)
    if values and q.device.type != "meta" and batch:
        capacity = block_table.shape[1] * k_cache.shape[1]
        if int(seqused_k.min()) < 0 or int(seqused_k.max()) > min(capacity, max_seqlen_k):
            raise ValueError(f"{_FN}: keys per sequence must be in [0, min(max_seqlen_k, "
                             f"block_table pages * page_size) = {min(capacity, max_seqlen_k)}]")
        if int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) > max_seqlen_q:
            raise ValueError(f"{_FN}: a sequence of q has more than max_seqlen_q={max_seqlen_q} "
                             "tokens")
        check_block_table_entries(_FN, block_table, k_cache.shape[0], seqused_k,
                                  k_cache.shape[1])
    q_bhnd = q.unsqueeze(0).transpose(1, 2)
    fp8 = fp8_quant.check_fp8_cache(_FN, q, k_cache, v_cache)
    check_attention_inputs(_FN, q_bhnd, *(t[:1].transpose(1, 2) for t in (k_cache, v_cache)),
                           None, fp8_kv=fp8)
    check_alibi(_FN, alibi_slopes, batch, q.shape[1], q.device)
    check_sinks(_FN, sinks, q_bhnd)
    return batch, fp8


@torch.library.custom_op("ipex_flash::paged_varlen_attention", mutates_args=(),
                         device_types=("cpu", "xpu"))
def paged_varlen_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                           seqused_k: Tensor, block_table: Tensor, max_seqlen_q: int,
                           max_seqlen_k: int, softmax_scale: Optional[float], causal: bool,
                           window_left: int, window_right: int, softcap: float,
                           alibi_slopes: Optional[Tensor],
                           sinks: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                           v_descale: Optional[Tensor] = None,
                           num_splits: int = 0) -> tuple[Tensor, Tensor]:
    return _attend(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                   max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                   alibi_slopes, sinks, k_descale, v_descale, num_splits, None)


@torch.library.custom_op("ipex_flash::paged_varlen_attention_out", mutates_args=("out",),
                         device_types=("cpu", "xpu"))
def paged_varlen_attention_out(q: Tensor, k_cache: Tensor, v_cache: Tensor,
                               cu_seqlens_q: Tensor, seqused_k: Tensor, block_table: Tensor,
                               max_seqlen_q: int, max_seqlen_k: int,
                               softmax_scale: Optional[float], causal: bool, window_left: int,
                               window_right: int, softcap: float,
                               alibi_slopes: Optional[Tensor], sinks: Optional[Tensor],
                               k_descale: Optional[Tensor], v_descale: Optional[Tensor],
                               num_splits: int, out: Tensor) -> Tensor:
    """paged_varlen_attention writing its output into `out` (vLLM's out=: a slice of the
    engine's output buffer); returns the LSE."""
    return _attend(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                   max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                   alibi_slopes, sinks, k_descale, v_descale, num_splits, out)[1]


def _attend(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
            max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
            alibi_slopes, sinks, k_descale, v_descale, num_splits,
            out: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    batch, fp8 = _check(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                        max_seqlen_k, alibi_slopes, sinks)
    k_descale, v_descale = fp8_quant.descales(_FN, k_descale, v_descale, fp8, batch,
                                             k_cache.shape[2], q.device)
    q = launch.with_contiguous_last_dim(q)
    cu_seqlens_q, seqused_k, block_table, alibi_slopes = (
        None if t is None else t.contiguous()
        for t in (cu_seqlens_q, seqused_k, block_table, alibi_slopes))
    sinks = launch.float_sinks(sinks)
    out, lse = launch.attention_outputs(q, v_cache.shape[3], (q.shape[1], q.shape[0]), out=out)
    if batch == 0 or q.shape[0] == 0:
        return out, lse
    scale = resolve_scale(softmax_scale, q.shape[-1], _FN)
    page_size = k_cache.shape[1]
    cache = [t.transpose(1, 2) for t in (k_cache, v_cache)]  # (pages, Hkv, page_size, D)
    # Sequences of at most max_sliced_decode_tokens new tokens (decodes, speculative drafts)
    # whose every row sees a key take the split-KV decode kernel, one call per length; the
    # others take the general kernel, alone, its K/V pack (matrix engines) sized by their keys
    # (launch.pack_keys_used).
    lengths_q = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    short = ((lengths_q >= 1) & (lengths_q <= C.max_sliced_decode_tokens(k_cache.shape[2]))
             & (seqused_k >= lengths_q))
    short_lengths, counts = torch.unique(lengths_q[short], return_counts=True)
    general_keys = torch.where(short, 0, seqused_k).sum()
    read = torch.cat([short_lengths.long(), counts, general_keys.view(1)]).tolist()  # one read
    lengths_count = (len(read) - 1) // 2
    short_lengths, counts = read[:lengths_count], read[lengths_count:-1]
    general_keys = read[-1]

    def options_for(index):
        """Cache options for the sequences `index` of the batch (None: all of them), and the
        tensors they point to, which the caller keeps alive until the launch has returned."""
        def rows_of(t):  # t's entries for those sequences
            return t if t is None or index is None else t[index].contiguous()

        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 \
            else rows_of(alibi_slopes)  # (H,) slopes are shared by every sequence
        tensors = (slopes, rows_of(seqused_k), rows_of(block_table), rows_of(k_descale),
                   rows_of(v_descale))
        slopes, keys, table, k_scale, v_scale = tensors
        return cache_options(scale, causal, window_left, window_right, softcap, slopes, sinks,
                             keys, max_seqlen_k, table, page_size, k_scale, v_scale), tensors

    if sum(counts) < batch:
        index, rows, cu_general = None, None, cu_seqlens_q
        if counts:  # the general sequences' rows, packed on their own
            index = (~short).nonzero().flatten()
            lengths = lengths_q[index]
            general_rows = int(lengths.sum())  # (q may hold rows past the last sequence)
            cu_general = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
            rows = torch.repeat_interleave(cu_seqlens_q[:-1][index] - cu_general[:-1], lengths,
                                           output_size=general_rows)
            rows = rows.long() + torch.arange(general_rows, device=q.device)
        q_gen = q if rows is None else q[rows]
        out_gen, lse_gen = (out, lse) if rows is None else launch.attention_outputs(
            q_gen, v_cache.shape[3], (q.shape[1], q_gen.shape[0]))
        options, _kept = options_for(index)
        options.cu_seqlens_q = launch.view(cu_general)
        options.max_seqlen_q = max_seqlen_q
        _cu_keys = launch.pack_keys_used(options, _kept[1], general_keys)
        launch.flash_fwd(*(launch.view(t) for t in (q_gen.unsqueeze(0).transpose(1, 2), *cache,
                                              out_gen.unsqueeze(0).transpose(1, 2), lse_gen)),
                      options, q.device)
        if rows is not None:
            out[rows] = out_gen
            lse[:, rows] = lse_gen
    for length in short_lengths:
        index = (short & (lengths_q == length)).nonzero().flatten()
        rows = cu_seqlens_q[:-1][index].long()[:, None] + torch.arange(length, device=q.device)
        q_dec = q[rows]  # (B_dec, length, H, D)
        out_dec, lse_dec = launch.attention_outputs(q_dec, v_cache.shape[3],
                                                    (q_dec.shape[0], q.shape[1], length))
        options, _kept = options_for(index)
        launch.run_forward(*(t.transpose(1, 2) for t in (q_dec, k_cache, v_cache, out_dec)),
                           lse_dec, options, max_seqlen_k, num_splits)
        out[rows] = out_dec
        lse[:, rows] = lse_dec.transpose(0, 1)
    return out, launch.natural_lse(lse, in_place=True)  # no backward reads it


register_inference_only(paged_varlen_attention,
                        "ipex_flash.flash_attn_varlen_func with block_table (paged KV cache)")


@paged_varlen_attention.register_fake
def _paged_varlen_attention_fake(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table,
                                 max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                                 window_right, softcap, alibi_slopes, sinks=None, k_descale=None,
                                 v_descale=None, num_splits=0):
    lse = _attend_fake(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                       max_seqlen_k, alibi_slopes, sinks, k_descale, v_descale)
    return launch.output_like(q, v_cache.shape[3]), lse


@paged_varlen_attention_out.register_fake
def _paged_varlen_attention_out_fake(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table,
                                     max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                                     window_left, window_right, softcap, alibi_slopes, sinks,
                                     k_descale, v_descale, num_splits, out):
    return _attend_fake(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                        max_seqlen_k, alibi_slopes, sinks, k_descale, v_descale)


def _attend_fake(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                 max_seqlen_k, alibi_slopes, sinks, k_descale, v_descale) -> Tensor:
    """The checks that need no values, and the LSE's fake."""
    batch, fp8 = _check(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                        max_seqlen_k, alibi_slopes, sinks, values=False)
    fp8_quant.descales(_FN, k_descale, v_descale, fp8, batch, k_cache.shape[2], q.device)
    return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def paged_varlen_func(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                      max_seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, block_table, seqused_k, sinks, k_descale=None,
                      v_descale=None, out=None, num_splits=0,
                      want_lse=False) -> tuple[Tensor, Optional[Tensor]]:
    """flash_attn_varlen_func with a block_table: (out, natural-log LSE (Hq, total_q) or None
    unless want_lse). Keys per sequence from seqused_k, or from cu_seqlens_k's differences when
    seqused_k is None. out: written in place (checked by the caller). A decode step (every
    sequence the same few new tokens) repeats its launch plan, before any check, once a first
    call of the same signature has been checked and run by the op."""
    fast = (dropout_p == 0.0 and type(window_size) is tuple and type(max_seqlen_q) is int
            and type(max_seqlen_k) is int
            and not needs_dispatcher(q, k_cache, v_cache, cu_seqlens_q, seqused_k, cu_seqlens_k,
                                     block_table, alibi_slopes, sinks, k_descale, v_descale,
                                     out))
    plan_args = [q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                 max_seqlen_k, softmax_scale, causal, window_size, softcap, alibi_slopes, sinks,
                 k_descale, v_descale, num_splits, out]
    if fast and seqused_k is not None:
        result = fast_calls.serving_decode(*plan_args, want_lse)
        if result is not None:
            return _returned(*result, want_lse)
    check_dropout_p(_FN, dropout_p)
    check_scale(_FN, softmax_scale)
    left, right = check_window(_FN, window_size)
    if dropout_p != 0.0:
        raise ValueError(f"{_FN}: dropout is not supported with a paged KV cache (block_table)")
    if seqused_k is None:
        if cu_seqlens_k is None:
            raise ValueError(f"{_FN}: with block_table, give seqused_k or cu_seqlens_k")
        check_cu_seqlens(_FN, "cu_seqlens_k", cu_seqlens_k, 2**31 - 1, q.device)
        seqused_k = plan_args[4] = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
        result = fast_calls.serving_decode(*plan_args, want_lse) if fast else None
        if result is not None:
            return _returned(*result, want_lse)
    args = (q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, int(max_seqlen_q),
            int(max_seqlen_k), softmax_scale, causal, left, right, float(softcap), alibi_slopes,
            sinks, k_descale, v_descale, num_splits)
    if out is None:
        out, lse = torch.ops.ipex_flash.paged_varlen_attention(*args)
    elif torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad
                                         for t in (q, k_cache, v_cache, alibi_slopes, sinks)):
        # The op that writes into out can have no autograd (an op's out= has none), so out
        # takes the functional op's result, and with it that op's backward, which raises.
        result, lse = torch.ops.ipex_flash.paged_varlen_attention(*args)
        out.copy_(result)
    else:
        lse = torch.ops.ipex_flash.paged_varlen_attention_out(*args, out)
    if fast:
        fast_calls.remember_serving(*plan_args)
    return out, lse if want_lse else None


def _returned(out, lse, want_lse):
    """A plan's (out, lse in the kernels' exp2 domain or None) as the caller returns them."""
    return out, launch.natural_lse(lse, in_place=True) if want_lse else None
