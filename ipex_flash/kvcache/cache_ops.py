"""The ops behind flash_attn_with_kvcache (flash_attn_kvcache.py): the append of new keys and
values into a KV cache, in place, and attention of a few new query tokens against the cache,
contiguous or paged. Layout (batch, seq_len, heads, head_dim); registered with torch.library,
with fake implementations and no backward (inference_only.py):
    ipex_flash::kvcache_append(k_cache!, v_cache!, k, v, cache_seqlens, block_table) -> ()
    ipex_flash::kvcache_attention(q, k_cache, v_cache, seqlens_k, block_table, softmax_scale,
        causal, window_left, window_right, softcap, alibi_slopes, sinks, num_splits, k_descale,
        v_descale, cache_leftpad) -> (out, softmax_lse)
"""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash._runtime import C
from ipex_flash.kvcache import fp8_quant
from ipex_flash.kvcache.checks import check_block_table_entries, check_cache, check_seqlens
from ipex_flash.kvcache.inference_only import register_inference_only
from ipex_flash.kvcache.leftpad import check_leftpad, keys_attended
from ipex_flash.ops import launch
from ipex_flash.ops.validation import check_sinks, softmax_scale as resolve_scale, window_bound

Tensor = torch.Tensor
_FN = "ipex_flash.flash_attn_with_kvcache"


@torch.library.custom_op("ipex_flash::kvcache_append", mutates_args=("k_cache", "v_cache"),
                         device_types=("cpu", "xpu"))
def kvcache_append(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor,
                   cache_seqlens: Tensor, block_table: Optional[Tensor],
                   k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None) -> None:
    """Writes k, v (B, Nnew, Hkv, D) into the caches at positions cache_seqlens[b] + i, and
    nowhere else. 16-bit k, v into an FP8 cache are quantised: divided by their descales
    ((B, Hkv) float32, see fp8_quant.descales), saturating."""
    check_appendable(k_cache, v_cache)
    batch, new = k.shape[:2]
    if fp8_quant.is_fp8(k_cache) and k.dtype != k_cache.dtype:
        k_descale, v_descale = fp8_quant.descales(_FN, k_descale, v_descale, True, batch,
                                                 k_cache.shape[2], k.device)
        k = fp8_quant.quantise(k, k_descale, k_cache.dtype)
        v = fp8_quant.quantise(v, v_descale, v_cache.dtype)
    positions = cache_seqlens.long()[:, None] + torch.arange(new, device=k.device)  # (B, Nnew)
    if block_table is None:
        rows = torch.arange(batch, device=k.device)[:, None].expand(batch, new)
        k_cache[rows, positions] = k
        v_cache[rows, positions] = v
    else:
        page_size = k_cache.shape[1]
        pages = torch.gather(block_table.long(), 1, positions // page_size)
        k_cache[pages, positions % page_size] = k
        v_cache[pages, positions % page_size] = v


@kvcache_append.register_fake
def _kvcache_append_fake(k_cache, v_cache, k, v, cache_seqlens, block_table, k_descale=None,
                         v_descale=None):
    check_appendable(k_cache, v_cache)
    return None


def kvcache_outputs(q: Tensor, v_cache: Tensor) -> tuple[Tensor, Tensor]:
    return launch.attention_outputs(launch.with_contiguous_last_dim(q), v_cache.shape[3],
                                    (q.shape[0], q.shape[2], q.shape[1]))


def check_appendable(k_cache: Tensor, v_cache: Tensor) -> None:
    """The caches an append writes into in place: elements of their own (an expanded cache
    would have one write land on every row sharing it, and a v_cache sharing k_cache's, as
    MLA's one latent cache does, would take both writes), and outside autograd (which cannot
    follow writes into a tensor that requires grad)."""
    if caches_share_rows(k_cache, v_cache):
        raise ValueError(
            f"{_FN}: k_cache and v_cache share memory (one latent cache for both, as MLA's, "
            "v_cache a view of k_cache's first columns), and appending k and v would write the "
            "shared columns twice; write the new tokens' rows into the cache yourself (e.g. "
            "kv_cache[page, slot] = kv_new, or vLLM's cache write) and call without k and v")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.requires_grad:
            raise ValueError(f"{_FN}: {name} requires grad, and appending k, v writes into it in "
                             "place; pass a cache that does not (e.g. cache.detach())")
        shared = [d for d in range(cache.dim()) if cache.stride(d) == 0 and cache.shape[d] > 1]
        if shared:
            raise ValueError(f"{_FN}: {name} is expanded (stride 0 in dimension {shared[0]}), and "
                             "appending k, v writes into it in place; pass a cache with memory "
                             "of its own (e.g. cache.clone())")


def caches_share_rows(k_cache: Tensor, v_cache: Tensor) -> bool:
    """Whether a row of k_cache and the same row of v_cache share memory, so that an append
    would write it twice (C.rows_overlap: MLA's latent cache and its first columns do; vLLM's
    kv.unbind(0), K and V halves of each row, and transformers' paged K and V a page apart in
    one buffer do not). From storage offsets, so fake and meta tensors too."""
    if not torch._C._is_alias_of(k_cache, v_cache):  # (different storages)
        return False
    return C.rows_overlap(*(C.TensorView(t.storage_offset() * t.element_size(),
                                          str(t.dtype).removeprefix("torch."), list(t.shape),
                                          list(t.stride())) for t in (k_cache, v_cache)))


def cache_options(scale: float, causal: bool, window_left: int, window_right: int,
                  softcap: float, alibi_slopes: Optional[Tensor], sinks: Optional[Tensor],
                  seqlens_k: Tensor, max_len_k: int, block_table: Optional[Tensor],
                  page_size: int, k_descale: Optional[Tensor] = None,
                  v_descale: Optional[Tensor] = None) -> "C.AttentionOptions":
    """The kernels' options for attention over a KV cache (masks bottom-right, keys per
    sequence seqlens_k, pages through block_table). Tensors are passed by address: the caller
    keeps them alive and dense until the launch has returned."""
    options = C.AttentionOptions()
    options.scale = scale
    options.mask = C.MaskParams(window_left=window_bound(window_left),
                                window_right=0 if causal else window_bound(window_right),
                                bottom_right=True)
    options.softcap = softcap
    if alibi_slopes is not None:
        options.alibi_slopes = launch.view(alibi_slopes)
    if sinks is not None:
        options.sinks = launch.view(sinks)
    options.seqlens_k = launch.view(seqlens_k)
    options.max_seqlen_k = max_len_k
    if block_table is not None:
        options.block_table = launch.view(block_table)
        options.page_size = page_size
    if k_descale is not None:  # an FP8 cache: (B, Hkv) float32 each (fp8_quant.descales)
        options.k_descale, options.v_descale = launch.view(k_descale), launch.view(v_descale)
    return options


@torch.library.custom_op("ipex_flash::kvcache_attention", mutates_args=(),
                         device_types=("cpu", "xpu"))
def kvcache_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens_k: Tensor,
                      block_table: Optional[Tensor], softmax_scale: Optional[float],
                      causal: bool, window_left: int, window_right: int, softcap: float,
                      alibi_slopes: Optional[Tensor],
                      sinks: Optional[Tensor] = None,
                      num_splits: int = 0, k_descale: Optional[Tensor] = None,
                      v_descale: Optional[Tensor] = None,
                      cache_leftpad: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    fp8 = check_cache(q, k_cache, v_cache, block_table)
    check_sinks(_FN, sinks, q.transpose(1, 2))
    check_seqlens(seqlens_k, q.shape[0], q.device, "seqlens_k")
    check_leftpad(_FN, cache_leftpad, q.shape[0], q.device)
    if block_table is not None:
        check_block_table_entries(_FN, block_table, k_cache.shape[0], seqlens_k,
                                  k_cache.shape[1])
    q = launch.with_contiguous_last_dim(q)
    # Passed by address: dense, and referenced here until the launch has returned.
    seqlens_k, block_table, alibi_slopes, cache_leftpad = (
        None if t is None else t.contiguous()
        for t in (seqlens_k, block_table, alibi_slopes, cache_leftpad))
    sinks = launch.float_sinks(sinks)
    out, lse = kvcache_outputs(q, v_cache)
    batch, head_dim = q.shape[0], q.shape[3]
    k_descale, v_descale = fp8_quant.descales(_FN, k_descale, v_descale, fp8, batch,
                                             k_cache.shape[2], q.device)
    keys, max_len_k, total_keys = keys_attended(seqlens_k, cache_leftpad)
    options = cache_options(resolve_scale(softmax_scale, head_dim, _FN), causal, window_left,
                            window_right, softcap, alibi_slopes, sinks, seqlens_k, max_len_k,
                            block_table, k_cache.shape[1], k_descale, v_descale)
    if cache_leftpad is not None:
        options.k_start = launch.view(cache_leftpad)
    # The caches seen as (B or pages, Hkv, N, D); q and out as (B, Hq, Nq, D).
    launch.run_forward(*(t.transpose(1, 2) for t in (q, k_cache, v_cache, out)), lse, options,
                       max_len_k, num_splits, keys_used=(keys, total_keys))
    return out, launch.natural_lse(lse, in_place=True)  # no backward reads it


register_inference_only(kvcache_attention, _FN)


@kvcache_attention.register_fake
def _kvcache_attention_fake(q, k_cache, v_cache, seqlens_k, block_table, softmax_scale, causal,
                            window_left, window_right, softcap, alibi_slopes, sinks=None,
                            num_splits=0, k_descale=None, v_descale=None, cache_leftpad=None):
    fp8 = check_cache(q, k_cache, v_cache, block_table)
    fp8_quant.descales(_FN, k_descale, v_descale, fp8, q.shape[0], k_cache.shape[2], q.device)
    check_sinks(_FN, sinks, q.transpose(1, 2))
    check_leftpad(_FN, cache_leftpad, q.shape[0], q.device)
    return kvcache_outputs(q, v_cache)
