"""Continuous batching (generate_batch, ContinuousBatchingManager) for the transformers backend.

transformers' continuous batching keeps every sequence's keys and values in its paged cache
(PagedAttentionCache) and runs each step as one packed batch: query tokens of all sequences
concatenated, (1, H, total_q, D), with cumulative lengths cu_seq_lens_q and cu_seq_lens_k (one
per layer type: a sliding-window layer's cache keeps only the last sliding_window - 1 keys).
Each step reaches the attention function in one of two forms, as it reaches transformers' own
paged flash-attn path (flash_attention_forward / _flash_attention_forward, and before 5.19
integrations/flash_paged.py), which this module mirrors with ipex_flash's kernels:

- cache indices (prefills, chunked prefills, mixed steps; every step on the CPU): the cache
  writes the new keys and values and gathers each sequence's keys back, (1, Hkv, total_k, D);
  the kernels run ipex_flash.flash_attn_varlen_func over them, causal from the bottom right,
  so the new tokens of each sequence attend to its cached keys and to each other;
- a block table (decode-only steps where transformers enables it, with a flash-attn 2 name on
  an XPU or CUDA device): each sequence's new key and value are written into the paged cache
  (num_pages, page_size, Hkv, D) through the table, and ipex_flash.flash_attn_with_kvcache
  attends through it.

Steps padded to fixed sizes (transformers pads them when it compiles a step or replays it from
a graph) have lanes without tokens or keys and query rows past the last sequence: those get
zero output rows, and nothing of theirs is written into the cache.

Softcap (Gemma 2), sinks (GPT-OSS, `s_aux`) and sliding windows reach both kernels.
"""
from __future__ import annotations

import functools
import inspect
from typing import Optional

import torch

import ipex_flash
from ipex_flash.integrations.transformers_attention import (
    BACKEND, PAGED_BACKEND, attention_forward, register_attention)
from ipex_flash.kvcache.slot_write import reshape_and_cache_flash as write_to_cache
from transformers import AttentionInterface, AttentionMaskInterface
from transformers import modeling_flash_attention_utils as flash_utils
from transformers.generation.continuous_batching import PagedAttentionCache
from transformers.masking_utils import sdpa_mask

# Before 5.19 transformers runs continuous batching under "paged|" + the model's name.
PAGED_PREFIX = "paged|"


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    s_aux: Optional[torch.Tensor] = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract for PAGED_BACKEND: query (B, Hq, Nq, D), key and
    value (B, Hkv, Nk, D) in, (B, Nq, Hq, D) out, and no attention weights.

    A continuous-batching step (B = 1, packed sequences, described by cu_seq_lens_q and
    cu_seq_lens_k) runs on the varlen or the paged KV-cache kernels; the attention mask, which
    transformers may still build for a step (the packed tokens seen as one sequence), is not
    used then. Packed sequences with cu_seq_lens (padding-free training) take the varlen kernel
    too. Any other call, such as generate() with a padding mask, is the mask path of
    attention_forward.
    """
    cache = kwargs.pop("cache", None)
    if cache is not None and not isinstance(cache, PagedAttentionCache):
        raise TypeError(f"attn_implementation={PAGED_BACKEND!r}: `cache` must be transformers' "
                        f"PagedAttentionCache, got {type(cache).__name__}")
    if cache is not None:
        # transformers <= 5.23 leaves the cache update to the attention function (5.24's models
        # do it before the call).
        key, value = _update_cache(cache, module, key, value, kwargs)
    if kwargs.get("cu_seq_lens_q") is None or kwargs.get("cu_seq_lens_k") is None:
        if cache is not None:
            raise ValueError(f"attn_implementation={PAGED_BACKEND!r}: a paged cache step needs "
                             "cu_seq_lens_q and cu_seq_lens_k")
        return attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                 scaling=scaling, is_causal=is_causal,
                                 sliding_window=sliding_window, softcap=softcap, s_aux=s_aux,
                                 **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"attn_implementation={PAGED_BACKEND!r}: packed sequences come as one "
                         f"batch row, got query of shape {tuple(query.shape)}")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # transformers' sliding_window counts the query's own key: sliding_window - 1 to the left.
    window = (-1, -1)
    if sliding_window is not None:
        window = (sliding_window - 1, 0 if is_causal else sliding_window - 1)
    softcap = 0.0 if softcap is None else softcap
    if kwargs.get("k_cache") is not None and kwargs.get("block_table") is not None:
        output = _paged_decode(query, key, value, kwargs, scaling, window, softcap, s_aux)
    else:
        output = _varlen(query, key, value, kwargs, dropout, scaling, bool(is_causal), window,
                         softcap, s_aux)
    return output, None


def _varlen(query, key, value, kwargs, dropout, scaling, causal, window, softcap, sinks):
    """Packed new tokens against the keys gathered for them: (1, total_q, Hq, D)."""
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    total_k = int(cu_k[-1])
    if key.shape[2] < total_k:
        raise ValueError(f"attn_implementation={PAGED_BACKEND!r}: cu_seq_lens_k covers {total_k} "
                         f"keys but {key.shape[2]} were given")
    max_q = _max_length(kwargs, "q", cu_q)
    max_k = _max_length(kwargs, "k", cu_k)
    # (1, H, T, D) -> (T, H, D): the kernels' packed layout.
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))
    output = ipex_flash.flash_attn_varlen_func(
        q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, dropout_p=dropout,
        softmax_scale=scaling, causal=causal, window_size=window, softcap=softcap, sinks=sinks)
    # A step padded to a fixed size (see _paged_decode) has query rows past its last sequence,
    # which the kernel leaves unwritten: zeros, rather than whatever the memory held.
    output[int(cu_q[-1]):] = 0
    return output.unsqueeze(0)


def _paged_decode(query, key, value, kwargs, scaling, window, softcap, sinks):
    """One new token per sequence, written into the paged cache through the block table and
    attended to with the sequence's cached keys: (1, batch, Hq, D).

    transformers pads a step to a fixed number of lanes when it compiles the step or replays
    it from a graph (ModelRunner.pad_inputs): a padded lane has no token and no key (its
    cu_seq_lens_k repeats the previous offset) and a block-table row of -1. Such a lane is
    written nowhere and attends to no key, which gives it a zero output row. The lanes are told
    apart on the device, so the step neither waits for it nor changes shape."""
    k_cache, v_cache, block_table = kwargs["k_cache"], kwargs["v_cache"], kwargs["block_table"]
    page_size = k_cache.shape[1]
    if page_size % 16 or page_size > 512:
        raise ValueError(
            f"attn_implementation={PAGED_BACKEND!r}: the paged kernels take a page size that is a "
            f"multiple of 16 up to 512, got {page_size}; set "
            "ContinuousBatchingConfig(page_size=...)")
    batch = query.shape[2]
    cu_k = kwargs["cu_seq_lens_k"]
    # Keys per sequence, this step's included (0 in a padded lane).
    keys = (cu_k[1:batch + 1] - cu_k[:batch]).to(torch.int32)
    # (transformers marks a sequence's unallocated table slots -1: past its keys, never read)
    block_table = block_table[:batch].to(torch.int32)
    # (1, H, batch, D) -> (batch, 1, H, D): one query token per sequence.
    q, k, v = (x[0].transpose(0, 1).unsqueeze(1).contiguous() for x in (query, key, value))
    write_to_cache(k[:, 0], v[:, 0], k_cache, v_cache,
                   _new_token_slots(keys, block_table, page_size), "auto", _NO_SCALE, _NO_SCALE)
    output = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=keys, block_table=block_table,
        softmax_scale=scaling, causal=True, window_size=window, softcap=softcap, sinks=sinks)
    return output.transpose(0, 1)


# The cache write's k_scale and v_scale, which a cache in the model's dtype does not read.
_NO_SCALE = torch.ones(())


def _new_token_slots(keys, block_table, page_size):
    """Each sequence's slot for its new token, page * page_size + offset of its last key, and
    -1 (write nothing) for a lane without keys."""
    position = (keys.long() - 1).clamp(min=0)
    pages = block_table.gather(1, (position // page_size)[:, None])[:, 0].long()
    return torch.where(keys > 0, pages * page_size + position % page_size, -1)


def _max_length(kwargs, side, cu_seqlens):
    """max_length_q / max_length_k (max_seqlen_* before 5.19) as an int, else from the offsets."""
    for name in (f"max_length_{side}", f"max_seqlen_{side}"):
        if kwargs.get(name) is not None:
            return int(kwargs[name])
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def _update_cache(cache, module, key, value, kwargs):
    """Writes this step's keys and values into the paged cache as transformers' own paged flash
    path does, and returns the keys and values to attend to, (1, Hkv, total_k, D). kwargs is
    updated in place with this layer's cu_seq_lens_k and max length (and, with a block table,
    k_cache, v_cache and the layer's block table)."""
    if _takes_kwargs(type(cache)):  # 5.19 - 5.23
        return cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                            kwargs=kwargs)
    # Up to 5.18 the lengths come per layer type and are selected by the layer's window, as
    # flash_paged.py does; the cache gathers keys and values as (total_k, Hkv, D).
    sliding = getattr(module, "sliding_window", None)
    layer_type = "sliding_attention" if sliding else "full_attention"
    for name in ("cu_seq_lens_k", "max_seqlen_k"):
        if isinstance(kwargs.get(name), dict):
            kwargs[name] = kwargs[name][layer_type]
    if kwargs.get("block_table") is not None:
        raise NotImplementedError(
            f"attn_implementation={PAGED_BACKEND!r}: this transformers version's block-table "
            "decode is not supported; set ContinuousBatchingConfig(max_blocks_per_request=0)")
    key, value = cache.update(key, value, module.layer_idx, kwargs["read_index"],
                              kwargs["write_index"])
    return key.transpose(0, 1).unsqueeze(0), value.transpose(0, 1).unsqueeze(0)


@functools.lru_cache(maxsize=None)
def _takes_kwargs(cache_class) -> bool:
    return "kwargs" in inspect.signature(cache_class.update).parameters


def _flash_functions(original):
    """transformers >= 5.19 admits a custom attention name into continuous batching only when
    the name contains "flash" (or is "sdpa" / "paged|eager"), and then loads a flash-attn
    package for that name through modeling_flash_attention_utils._lazy_imports: on a name it
    does not know, it looks for a kernel on the Hugging Face Hub and fails. This wrapper answers
    that loader with ipex_flash's flash-attn functions for PAGED_BACKEND and passes every other
    name on. transformers only checks them (the decode fast path needs flash_attn_with_kvcache);
    the attention itself is paged_attention_forward."""

    @functools.wraps(original)
    def lazy_imports(implementation, *args, **kwargs):
        name = implementation.removeprefix(PAGED_PREFIX) if implementation else implementation
        if name == PAGED_BACKEND:
            return (ipex_flash.flash_attn_func, ipex_flash.flash_attn_varlen_func,
                    ipex_flash.flash_attn_with_kvcache, flash_utils._pad_input,
                    flash_utils._unpad_input)
        return original(implementation, *args, **kwargs)

    lazy_imports.ipex_flash_loader = True
    return lazy_imports


def continuous_batching_name() -> str:
    """The name transformers runs the backend under in continuous batching: "paged|" + BACKEND
    while it still registers "paged|sdpa" (it then switches a BACKEND model to that name
    itself), PAGED_BACKEND from 5.19 on."""
    if PAGED_PREFIX + "sdpa" in AttentionInterface():
        return PAGED_PREFIX + BACKEND
    return PAGED_BACKEND


def enable_continuous_batching(model: torch.nn.Module) -> str:
    """Readies a model for generate_batch and ContinuousBatchingManager on ipex_flash's kernels
    and returns continuous_batching_name(). generate() keeps working on the model.

    Before 5.19 the model is set to BACKEND and continuous batching switches it to "paged|"
    BACKEND itself. From 5.19 the model's configs are set to PAGED_BACKEND directly rather than
    through set_attn_implementation: models that list the flash kernels they accept
    (_compatible_flash_implementations: GPT-OSS, whose kernels must take its sinks, as these
    do) replace any other name containing "flash" with the first kernel of their list.
    """
    register_attention()
    register_paged()
    name = continuous_batching_name()
    if name.startswith(PAGED_PREFIX):
        model.set_attn_implementation(BACKEND)
        return name
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            # The setter also sets the config's sub-configs.
            module.config._attn_implementation = PAGED_BACKEND
    return name


def register_paged() -> None:
    """Registers PAGED_BACKEND (with transformers' SDPA mask function, for calls outside
    continuous batching), the "paged|" names transformers <= 5.18 switches BACKEND and
    PAGED_BACKEND to for continuous batching, and the flash loader hook. Idempotent."""
    AttentionInterface.register(PAGED_BACKEND, paged_attention_forward)
    AttentionMaskInterface.register(PAGED_BACKEND, sdpa_mask)
    for name in (BACKEND, PAGED_BACKEND):
        # No mask function: transformers then builds no mask, and a paged step needs none.
        AttentionInterface.register(PAGED_PREFIX + name, paged_attention_forward)
    if not getattr(flash_utils._lazy_imports, "ipex_flash_loader", False):
        flash_utils._lazy_imports = _flash_functions(flash_utils._lazy_imports)
