"""Argument checks of flash_attn_with_kvcache and its ops (cache_ops.py), shared with the paged
serving call (paged_varlen.py): cache shapes and dtypes, sequence lengths, page sizes, block
tables, cache_batch_idx. Value checks read the device (one sync each); they are skipped for
meta tensors, which the fake implementations see."""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash.kvcache import fp8_quant
from ipex_flash.ops.validation import check_attention_inputs

Tensor = torch.Tensor
_FN = "ipex_flash.flash_attn_with_kvcache"
PAGE_SIZE_STEP, MAX_PAGE_SIZE = 16, 512


def check_block_table_entries(fn: str, block_table: Tensor, pages: int, keys: Tensor,
                              page_size: int) -> None:
    """Every entry a sequence reads a page index in [0, pages): those of its first
    ceil(keys[b] / page_size) pages. Entries past them are never read and may hold anything
    (vLLM leaves stale pages there, transformers -1), as in flash-attn."""
    if block_table.device.type == "meta" or not block_table.numel():
        return
    used = (torch.arange(block_table.shape[1], device=block_table.device)[None, :] * page_size
            < keys.to(torch.int64)[:, None])
    bad = used & ((block_table < 0) | (block_table >= pages))
    if bool(bad.any()):
        raise ValueError(f"{fn}: block_table entries must be page indices in [0, {pages}) "
                         "where a sequence reads them (its first ceil(keys / page_size))")


def cache_capacity(k_cache: Tensor, block_table: Optional[Tensor]) -> int:
    """Keys a sequence can hold: the cache's length, or its pages times the page size."""
    return k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)


def check_cache(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Optional[Tensor]) -> bool:
    """Checks the call's tensors, all but the block table's entries (which need the keys per
    sequence: check_block_table_entries); returns whether the cache is FP8 (fp8_quant.py)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{_FN}: {name} must be 4-D (batch or pages, seq_len, heads, "
                             f"head_dim), got {shape}")
    batch = q.shape[0]
    if block_table is None:
        if k_cache.shape[0] < batch:
            raise ValueError(f"{_FN}: k_cache holds {k_cache.shape[0]} sequences, q has {batch}")
        k_view, v_view = k_cache[:batch], v_cache[:batch]
    else:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
            raise TypeError(f"{_FN}: block_table must be an int32 tensor")
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ValueError(f"{_FN}: block_table must have shape ({batch}, max_blocks), got "
                             f"{tuple(block_table.shape)}")
        if block_table.device != q.device:
            raise ValueError(f"{_FN}: block_table is on {block_table.device}, q on {q.device}")
        k_view, v_view = k_cache[:1].expand(batch, -1, -1, -1), v_cache[:1].expand(batch, -1, -1, -1)
    if v_cache.shape[:3] != k_cache.shape[:3]:  # its head dim may differ
        raise ValueError(f"{_FN}: v_cache must have k_cache's shape but for the head dim, "
                         f"{tuple(k_cache.shape[:3])}, got {tuple(v_cache.shape)}")
    if k_cache.shape[1] == 0:  # a cache holds keys (attention's own checks allow none)
        raise ValueError(f"{_FN}: k and v must have at least one key (seq_len k.shape[2] >= 1)")
    fp8 = fp8_quant.check_fp8_cache(_FN, q, k_cache, v_cache)
    check_attention_inputs(_FN, *(t.transpose(1, 2) for t in (q, k_view, v_view)), None,
                           fp8_kv=fp8)
    return fp8


def check_seqlens(seqlens: Tensor, batch: int, device: torch.device, name: str) -> None:
    if not isinstance(seqlens, torch.Tensor) or seqlens.dtype != torch.int32:
        raise TypeError(f"{_FN}: {name} must be an int or an int32 tensor")
    if tuple(seqlens.shape) != (batch,):
        raise ValueError(f"{_FN}: {name} must have shape ({batch},), got {tuple(seqlens.shape)}")
    if seqlens.device != device:
        raise ValueError(f"{_FN}: {name} is on {seqlens.device}, q on {device}")


def check_fits(seqlens: Tensor, new: int, capacity: int) -> None:
    if seqlens.device.type != "meta" and seqlens.numel():
        if int(seqlens.min()) < 0:
            raise ValueError(f"{_FN}: cache_seqlens must be >= 0, got {seqlens.tolist()}")
        if int(seqlens.max()) + new > capacity:
            raise ValueError(f"{_FN}: cache_seqlens + new tokens ({int(seqlens.max())} + {new}) "
                             f"exceeds the cache capacity {capacity}")


def is_kernel_page_size(page_size: int) -> bool:
    """A page the kernels read: a multiple of PAGE_SIZE_STEP up to MAX_PAGE_SIZE tokens."""
    return page_size % PAGE_SIZE_STEP == 0 and 0 < page_size <= MAX_PAGE_SIZE


def check_page_size(k_cache: Tensor) -> None:
    page_size = k_cache.shape[1]
    if not is_kernel_page_size(page_size):
        raise ValueError(f"{_FN}: page size (k_cache.shape[1]) must be a multiple of "
                         f"{PAGE_SIZE_STEP} up to {MAX_PAGE_SIZE}, got {page_size}")


def check_batch_idx(cache_batch_idx, batch: int, k_cache: Tensor, block_table) -> None:
    if cache_batch_idx is None:
        return
    if block_table is not None:
        raise ValueError(f"{_FN}: cache_batch_idx and block_table cannot be used together")
    check_seqlens(cache_batch_idx, batch, k_cache.device, "cache_batch_idx")
    if cache_batch_idx.device.type != "meta" and batch and (
            int(cache_batch_idx.min()) < 0 or int(cache_batch_idx.max()) >= k_cache.shape[0]):
        raise ValueError(f"{_FN}: cache_batch_idx entries must index k_cache's batch, in "
                         f"[0, {k_cache.shape[0]})")
