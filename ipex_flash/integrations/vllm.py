"""vLLM on ipex_flash, the alternative route: a module shaped like vllm-xpu-kernels'
vllm_xpu_kernels.flash_attn_interface (the attention entry point vLLM's XPU platform imports)
and vLLM's per-layer KV-cache write. The main route is the attention backend that the
IPEX_FLASH_VLLM=1 switch registers (integrations/vllm_backend/, docs/serving.md): it serves
softcap, ALiBi and FP8 caches, which vLLM's XPU wrapper of this function does not pass on.

    from ipex_flash.integrations import vllm as ipex_vllm
    ipex_vllm.install()   # before vLLM imports its XPU ops; see docs/serving.md

    out = ipex_vllm.flash_attn_varlen_func(q, k_cache, v_cache, max_seqlen_q, cu_seqlens_q,
                                           max_seqlen_k, seqused_k=seqused_k,
                                           block_table=block_table, causal=True, out=out)
    ipex_vllm.reshape_and_cache_flash(key, value, k_cache, v_cache, slot_mapping, "auto",
                                      k_scale, v_scale)

Layouts are vLLM's: q (total_q, nheads, headdim) packed, the paged cache (num_blocks,
block_size, nheads_k, headdim). vLLM is not imported here.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import types

import torch

import ipex_flash
from ipex_flash.kvcache.slot_write import reshape_and_cache_flash as _cache_write_op

Tensor = torch.Tensor
LOGGER = logging.getLogger("ipex_flash")
_FN = "ipex_flash.integrations.vllm.flash_attn_varlen_func"
PACKAGE = "vllm_xpu_kernels"
MODULE = PACKAGE + ".flash_attn_interface"
DEFAULT_FA_VERSION = 2  # vllm_xpu_kernels' name, read by some callers


def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None,
                           seqused_k=None, q_v=None, dropout_p=0.0, softmax_scale=None,
                           causal=False, window_size=None, softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None,
                           return_softmax_lse=False, out=None, scheduler_metadata=None,
                           q_descale=None, k_descale=None, v_descale=None, num_splits=0,
                           fa_version=DEFAULT_FA_VERSION, s_aux=None, num_splits_kv=None,
                           is_mix_batch=True, host_kv_lens=None):
    """vllm_xpu_kernels.flash_attn_varlen_func's arguments, in its order, on
    ipex_flash.flash_attn_varlen_func (see its docstring for the layouts and masks).

    q (total_q, nheads, headdim) packed by cu_seqlens_q (batch + 1,) int32. k, v either packed
    keys (total_k, nheads_k, headdim) with cu_seqlens_k, or a paged cache (num_blocks,
    block_size, nheads_k, headdim) with block_table (batch, max_blocks) int32 and seqused_k
    (batch,) int32, the keys of each sequence. window_size: [left, right] or None (no window);
    s_aux: (nheads,) attention-sink logits; out: the output's storage, written in place.

    Only in vllm_xpu_kernels' interface:
        host_kv_lens: seqused_k given on the host (a list or CPU tensor); copied to q's device.
        num_splits_kv: a split-KV hint, passed on as num_splits.
        is_mix_batch: a hint for its kernels, not needed here.
        return_attn_probs: accepted and unused, as there: the result is out, or (out,
            softmax_lse (nheads, total_q) float32) with return_softmax_lse.
        q_v: MLA's second query; not supported (ValueError).
    """
    if q_v is not None:
        raise ValueError(f"{_FN}: q_v (MLA's value-side query) is not supported; pass q_v=None")
    if host_kv_lens is not None:
        if seqused_k is not None:
            raise ValueError(f"{_FN}: give host_kv_lens or seqused_k, not both")
        seqused_k = torch.as_tensor(host_kv_lens, dtype=torch.int32).to(q.device)
    if num_splits_kv is not None:
        num_splits = num_splits_kv
    # Forwarded by keyword when not at their default, so a call uses only what it needs.
    options = {name: value for name, value, default in (
        ("dropout_p", dropout_p, 0.0), ("softmax_scale", softmax_scale, None),
        ("causal", causal, False), ("softcap", softcap, 0.0),
        ("alibi_slopes", alibi_slopes, None), ("deterministic", deterministic, False),
        ("block_table", block_table, None), ("seqused_k", seqused_k, None),
        ("sinks", s_aux, None), ("return_softmax_lse", return_softmax_lse, False),
        ("out", out, None), ("scheduler_metadata", scheduler_metadata, None),
        ("q_descale", q_descale, None), ("k_descale", k_descale, None),
        ("v_descale", v_descale, None), ("num_splits", num_splits, 0),
        ("fa_version", fa_version, DEFAULT_FA_VERSION)) if not _is_default(value, default)}
    if window_size is not None:
        if len(window_size) != 2:
            raise ValueError(f"{_FN}: window_size must be [left, right], got {window_size!r}")
        options["window_size"] = (int(window_size[0]), int(window_size[1]))
    return ipex_flash.flash_attn_varlen_func(
        q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **options)


def _is_default(value, default) -> bool:
    # `is` for None and tensors (a tensor's == is elementwise); == for numbers and flags.
    if default is None or isinstance(value, Tensor):
        return value is default
    return type(value) in (bool, int, float) and value == default


def reshape_and_cache_flash(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                            slot_mapping: Tensor, kv_cache_dtype: str, k_scale: Tensor,
                            v_scale: Tensor) -> None:
    """vLLM's cache write: key[i], value[i] (num_tokens, num_kv_heads, head_size) into
    key_cache, value_cache (num_blocks, block_size, num_kv_heads, head_size) at slot
    slot_mapping[i] (block * block_size + offset; -1: not written), in place.
    kv_cache_dtype "auto", or "fp8" / "fp8_e4m3" / "fp8_e5m2" with a uint8 or float8 cache
    holding key / k_scale, value / v_scale, saturated. The op torch.ops.ipex_flash.
    reshape_and_cache_flash (kvcache/slot_write.py, where the checks are described)."""
    torch.ops.ipex_flash.reshape_and_cache_flash(key, value, key_cache, value_cache,
                                                 slot_mapping, kv_cache_dtype, k_scale, v_scale)


# vLLM's name and schema for the cache write (vllm._custom_ops calls it there).
CACHE_OP = "_C_cache_ops::reshape_and_cache_flash"
_CACHE_OP_SCHEMA = ("(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
                    "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) "
                    "-> ()")
_libraries: list = []  # a torch.library.Library unregisters its ops when collected


def install(cache_op: bool = True) -> bool:
    """Makes an installed vLLM use these functions. Returns whether the cache write is
    ipex_flash's.

    - sys.modules["vllm_xpu_kernels.flash_attn_interface"] becomes this module (and, if the
      vllm_xpu_kernels package is not installed, an empty package stands in for it), so
      `from vllm_xpu_kernels.flash_attn_interface import flash_attn_varlen_func` gives ours.
      Call install() before vLLM imports it (its XPU platform and ops modules).
    - cache_op: define torch.ops._C_cache_ops.reshape_and_cache_flash, where vLLM's
      _custom_ops.reshape_and_cache_flash calls, as ipex_flash's write. Only if no such op
      exists: vllm_xpu_kernels' compiled ops (vllm_xpu_kernels._C, which vLLM's XPU platform
      loads with its other kernels) are loaded first if installed, and then their write stays.
    """
    module = sys.modules[__name__]
    sys.modules[MODULE] = module
    parent = sys.modules.get(PACKAGE)
    if parent is None and importlib.util.find_spec(PACKAGE) is None:
        parent = types.ModuleType(PACKAGE, "Stands in for vllm_xpu_kernels (not installed): "
                                  "ipex_flash.integrations.vllm.install()")
        parent.__path__ = []
        sys.modules[PACKAGE] = parent
    if parent is not None:
        parent.flash_attn_interface = module
        parent.flash_attn_varlen_func = flash_attn_varlen_func
    if not cache_op or _libraries:
        return _installed(bool(_libraries))
    try:  # its op definitions would collide with ours if loaded after them
        importlib.import_module(PACKAGE + "._C")
    except ImportError:
        pass
    namespace, name = CACHE_OP.split("::")
    if hasattr(getattr(torch.ops, namespace), name):
        return _installed(False)
    library = torch.library.Library(namespace, "FRAGMENT")
    library.define(name + _CACHE_OP_SCHEMA)
    library.impl(name, _cache_write_op, "CompositeExplicitAutograd")
    _libraries.append(library)
    return _installed(True)


def _installed(cache_op: bool) -> bool:
    LOGGER.info("%s is ipex_flash.integrations.vllm (attention on ipex_flash's kernels); the "
                "cache write %s is %s", MODULE, CACHE_OP,
                "ipex_flash's" if cache_op else "the one already defined")
    return cache_op
