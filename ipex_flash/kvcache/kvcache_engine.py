"""flash_attn_with_kvcache's call as flash-attn 3 and sgl-kernel make it (SGLang's decode and
extend steps): page_table for block_table, packed queries (total_q, nheads, headdim) with
cu_seqlens_q and max_seqlen_q, packed appends with cu_seqlens_k_new, out=, q_descale, and the
scheduling hints (kvcache/engine_args.py). Packed queries run the serving call
(flash_attn_varlen_func over the cache's pages); a contiguous cache is read as pages of its
own rows."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ipex_flash.kvcache import engine_args, fp8_quant
from ipex_flash.kvcache.checks import (
    MAX_PAGE_SIZE, PAGE_SIZE_STEP, check_block_table_entries, check_seqlens)
from ipex_flash.ops.validation import (
    check_alibi, check_scale, check_sinks, check_softcap, check_window)

Tensor = torch.Tensor
_FN = "ipex_flash.flash_attn_with_kvcache"


def check_fa3_extras(rotary_seqlens, attention_chunk) -> None:
    """flash-attn 3's arguments these kernels do not implement, refused unless unused."""
    if rotary_seqlens is not None:
        raise ValueError(f"{_FN}: rotary_seqlens is not supported; rotary positions start at "
                         "cache_seqlens")
    if attention_chunk not in (0, None):
        raise ValueError(f"{_FN}: attention_chunk must be 0 (chunked attention is not "
                         f"supported), got {attention_chunk!r}")


def packed_call(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                block_table, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_cos,
                out, varlen_call: Callable, **attention):
    """Packed queries q (total_q, nheads, headdim) over the cache, after appending k, v
    (packed (total_new, nheads_k, headdim) with cu_seqlens_k_new, or (batch, seqlen_new, ...))
    at cache_seqlens[b]. varlen_call(q, k_pages, v_pages, **kw): flash_attn_varlen_func."""
    if not isinstance(cu_seqlens_q, Tensor) or cu_seqlens_q.dim() != 1:
        raise ValueError(f"{_FN}: packed q (total_q, nheads, headdim) needs cu_seqlens_q, a "
                         "(batch + 1,) int32 tensor")
    if type(max_seqlen_q) is not int or max_seqlen_q < 0:
        raise ValueError(f"{_FN}: packed q needs max_seqlen_q, an int >= 0, got "
                         f"{max_seqlen_q!r}")
    if cache_leftpad is not None or rotary_cos is not None:
        raise ValueError(f"{_FN}: cache_leftpad and rotary_cos/rotary_sin are taken with q "
                         "(batch, seqlen, nheads, headdim), not with packed q")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{_FN}: {name} must be 4-D (batch or pages, seq_len, heads, "
                             "head_dim)")
    batch = cu_seqlens_q.shape[0] - 1
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    check_seqlens(cache_seqlens, batch, q.device, "cache_seqlens")
    if block_table is None:
        k_cache, v_cache, block_table = _rows_as_pages(k_cache, v_cache, cache_batch_idx, batch)
    elif cache_batch_idx is not None:
        raise ValueError(f"{_FN}: cache_batch_idx and page_table cannot be used together")
    capacity = block_table.shape[1] * k_cache.shape[1]
    seqused_k = cache_seqlens
    if (k is None) != (v is None):
        raise ValueError(f"{_FN}: k and v must be given together")
    if k is not None:
        _check_attention(q, v_cache, batch, out, attention)  # (before the append writes)
        seqused_k = _append(k_cache, v_cache, k, v, cache_seqlens, cu_seqlens_k_new, block_table,
                            capacity, attention.get("k_descale"), attention.get("v_descale"),
                            _query_dtype(q, out))
    elif cu_seqlens_k_new is not None:
        raise ValueError(f"{_FN}: cu_seqlens_k_new is given without k and v")
    return varlen_call(q, k_cache, v_cache, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                       seqused_k=seqused_k, max_seqlen_k=capacity, block_table=block_table,
                       out=out, **attention)


def _query_dtype(q: Tensor, out: Optional[Tensor]) -> torch.dtype:
    """The dtype the kernels take q in: an FP8 q's is out's (the model's) if 16-bit, else
    bfloat16 (engine_args.apply_descales)."""
    if not fp8_quant.is_fp8(q):
        return q.dtype
    return fp8_quant.widened_query_dtype(getattr(out, "dtype", None))


def _check_attention(q: Tensor, v_cache: Tensor, batch: int, out: Optional[Tensor],
                     attention: dict) -> None:
    """The attention's arguments that would refuse the call, checked before an append writes
    into the cache (a refused call leaves the cache as it was)."""
    check_scale(_FN, attention["softmax_scale"])
    check_window(_FN, attention["window_size"])
    check_softcap(_FN, attention["softcap"])
    check_alibi(_FN, attention["alibi_slopes"], batch, q.shape[1], q.device)
    check_sinks(_FN, attention["sinks"], q.unsqueeze(0).transpose(1, 2))
    descaled = engine_args.apply_descales(
        _FN, q[:0], v_cache.dtype, attention["q_descale"], attention["k_descale"],
        attention["v_descale"], batch, v_cache.shape[2],
        out_dtype=getattr(out, "dtype", None))
    if out is not None:
        engine_args.check_out(_FN, out, (q.shape[0], q.shape[1], v_cache.shape[3]),
                              descaled.q.dtype, q.device)


def _rows_as_pages(k_cache: Tensor, v_cache: Tensor, cache_batch_idx: Optional[Tensor],
                   batch: int) -> tuple[Tensor, Tensor, Tensor]:
    """A contiguous cache (batch_cache, seqlen_cache, nheads_k, headdim) seen, without a copy,
    as pages of P rows (the largest multiple of 16 up to 512 dividing seqlen_cache), and the
    block table of each sequence's row."""
    rows = k_cache.shape[1]
    page = next((p for p in range(MAX_PAGE_SIZE, 0, -PAGE_SIZE_STEP) if rows % p == 0), None)
    if page is None:
        raise ValueError(f"{_FN}: packed q over a contiguous cache needs its seq_len "
                         f"(k_cache.shape[1] = {rows}) to be a multiple of {PAGE_SIZE_STEP}; "
                         "pass a paged cache (page_table) otherwise")
    try:
        pages = [t.view(t.shape[0] * (rows // page), page, *t.shape[2:]) for t in (k_cache, v_cache)]
    except RuntimeError as error:
        raise ValueError(f"{_FN}: packed q over a contiguous cache needs each cache's batch "
                         "and seq_len dimensions to be one run of rows (e.g. cache.contiguous())"
                         ) from error
    if cache_batch_idx is None:
        if k_cache.shape[0] < batch:
            raise ValueError(f"{_FN}: k_cache holds {k_cache.shape[0]} sequences, q has {batch}")
        cache_rows = torch.arange(batch, dtype=torch.int32, device=k_cache.device)
    else:
        check_seqlens(cache_batch_idx, batch, k_cache.device, "cache_batch_idx")
        cache_rows = cache_batch_idx
    per_row = rows // page
    table = (cache_rows[:, None] * per_row
             + torch.arange(per_row, dtype=torch.int32, device=k_cache.device))
    return pages[0], pages[1], table.to(torch.int32)


def _append(k_cache, v_cache, k, v, cache_seqlens, cu_seqlens_k_new, block_table, capacity,
            k_descale, v_descale, q_dtype) -> Tensor:
    """Writes k, v into the pages at cache_seqlens[b] + i; returns the keys per sequence after
    it. Checked before anything is written."""
    batch = cache_seqlens.shape[0]
    if k.dim() == 4:  # (batch, seqlen_new, nheads_k, headdim)
        if cu_seqlens_k_new is not None:
            raise ValueError(f"{_FN}: cu_seqlens_k_new is taken with packed k (total_new, "
                             "nheads_k, headdim)")
        new = k.shape[1]
        k, v = k.flatten(0, 1), v.flatten(0, 1)
        cu_seqlens_k_new = torch.arange(0, (batch + 1) * new, new, dtype=torch.int32,
                                        device=k.device)
    elif cu_seqlens_k_new is None:
        raise ValueError(f"{_FN}: packed k (total_new, nheads_k, headdim) needs cu_seqlens_k_new")
    for name, t, cache in (("k", k, k_cache), ("v", v, v_cache)):
        if not isinstance(t, Tensor) or t.dim() != 3 or tuple(t.shape[1:]) != tuple(cache.shape[2:]):
            raise ValueError(f"{_FN}: {name} must be (total_new, nheads_k, headdim) = "
                             f"(-1, {cache.shape[2]}, {cache.shape[3]}), got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else t}")
        fp8 = fp8_quant.is_fp8(cache)
        if t.dtype != cache.dtype and not (fp8 and t.dtype == q_dtype):
            raise TypeError(f"{_FN}: {name}.dtype ({t.dtype}) must equal the cache's "
                            f"({cache.dtype})" + (f" or q's ({q_dtype})" if fp8 else ""))
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"{_FN}: k and v must have one token count, got {k.shape[0]} and "
                         f"{v.shape[0]}")
    check_seqlens(cu_seqlens_k_new, batch + 1, k.device, "cu_seqlens_k_new")
    new_lengths = cu_seqlens_k_new[1:] - cu_seqlens_k_new[:-1]
    after = cache_seqlens + new_lengths
    if k.device.type != "meta" and batch and (
            int(cu_seqlens_k_new[0]) != 0 or int(cache_seqlens.min()) < 0
            or int(new_lengths.min()) < 0 or int(after.max()) > capacity
            or int(cu_seqlens_k_new[-1]) > k.shape[0]):
        raise ValueError(f"{_FN}: cu_seqlens_k_new must start at 0 and not decrease, its "
                         f"tokens within k ({k.shape[0]}); cache_seqlens >= 0, and with the "
                         f"new tokens within the cache's capacity ({capacity})")
    check_block_table_entries(_FN, block_table, k_cache.shape[0], after, k_cache.shape[1])
    # The rows of the sequences (k may hold padding rows past them, written nowhere).
    kept = torch.arange(k.shape[0], device=k.device) < cu_seqlens_k_new[-1]
    k, v = k[kept], v[kept]
    seq = engine_args.sequence_of_rows(cu_seqlens_k_new, k.shape[0])
    position = (cache_seqlens[seq] + torch.arange(k.shape[0], device=k.device)
                - cu_seqlens_k_new[seq]).long()
    page_size = k_cache.shape[1]
    pages = block_table.long()[seq, position // page_size]
    k, v = stored_as(k, v, k_cache, k_descale, v_descale, batch, seq)
    k_cache[pages, position % page_size] = k
    v_cache[pages, position % page_size] = v
    return after.to(torch.int32)


def stored_as(k: Tensor, v: Tensor, cache: Tensor, k_descale, v_descale, batch: int,
              seq: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """New k, v as the cache stores them: divided by their descales (the cache holds
    k / k_descale, FP8 or 16-bit alike) and rounded to the cache's dtype, saturating for FP8.
    k, v (batch, seqlen_new, nheads_k, D), or packed (total_new, nheads_k, D) with seq their
    tokens' sequences."""
    if k.dtype == cache.dtype and fp8_quant.is_fp8(cache):
        return k, v  # (quantised already: what the cache is to hold)
    fp8 = fp8_quant.is_fp8(cache)
    if not fp8 and k_descale is None and v_descale is None:
        return k, v
    tables = fp8_quant.descales(_FN, k_descale, v_descale, True, batch, cache.shape[2],
                                k.device)
    result = []
    for t, table in ((k, tables[0]), (v, tables[1])):
        packed = seq is not None
        t4 = t[:, None] if packed else t
        d = table[seq] if packed else table
        t4 = fp8_quant.quantise(t4, d, cache.dtype) if fp8 else \
            (t4.float() / d[:, None, :, None]).to(cache.dtype)
        result.append(t4[:, 0] if packed else t4)
    return result[0], result[1]
