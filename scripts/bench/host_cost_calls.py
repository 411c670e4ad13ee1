"""The calls benchmark_host_cost.py times: each entry point's call on a decode step, the
tensors they share in each layout, and the decode kernels launched alone per layout."""
from __future__ import annotations

import ipex_flash  # before torch: shortens torch's OpenMP spin (ipex_flash/_runtime.py)
import torch
import torch.nn.functional as F
from ipex_flash._runtime import C
from ipex_flash.kvcache.cache_ops import cache_options
from ipex_flash.ops import launch
from ipex_flash.ops.attention_forward import sdpa_options
from ipex_flash.ops.flash_attn_args import flash_options

PAGE = 64

ENTRY_POINTS = ("torch_sdpa", "sdpa", "op", "flash_attn_func", "kvcache", "kvcache_paged",
                "kvcache_append", "kvcache_rotary", "paged_varlen", "vllm_call", "kvcache_fa3",
                "varlen", "kvpacked")
XPU_PATH = ("kvcache", "kvcache_paged", "kvcache_append", "kvcache_rotary", "paged_varlen",
            "vllm_call", "kvcache_fa3")
KERNEL_LAYOUT = {"sdpa": "bhnd", "op": "bhnd", "flash_attn_func": "bnhd", "kvcache": "bnhd",
                 "kvcache_paged": "paged", "kvcache_append": "paged",
                 "kvcache_rotary": "paged", "paged_varlen": "paged", "vllm_call": "paged",
                 "kvcache_fa3": "paged"}


def tensors(batch, keys, heads_q, heads_kv, head_dim):
    """The same queries, keys and values in each layout: (B, H, N, D), (B, N, H, D) and pages
    of PAGE keys (at least one page) in shuffled order with their block table."""
    q = torch.randn(batch, heads_q, 1, head_dim)
    k, v = (torch.randn(batch, heads_kv, keys, head_dim) for _ in range(2))
    t = dict(q=q, k=k, v=v, q_bnhd=q.transpose(1, 2).contiguous())
    t["k_bnhd"], t["v_bnhd"] = (x.transpose(1, 2).contiguous() for x in (k, v))
    per_seq = -(-keys // PAGE)
    order = torch.randperm(batch * per_seq)
    t["block_table"] = order.view(batch, per_seq).to(torch.int32)
    for name in ("k", "v"):
        padded = F.pad(t[f"{name}_bnhd"], (0, 0, 0, 0, 0, per_seq * PAGE - keys))
        pages = torch.empty(batch * per_seq, PAGE, heads_kv, head_dim)
        pages[order] = padded.reshape(batch * per_seq, PAGE, heads_kv, head_dim)
        t[f"{name}_pages"] = pages
    t["seqlens"] = torch.full((batch,), keys, dtype=torch.int32)
    t["seqlens_before_last"] = t["seqlens"] - 1  # kvcache_append writes the last key again
    t["k_last"], t["v_last"] = (t[f"{name}_bnhd"][:, -1:].contiguous() for name in ("k", "v"))
    t["cos"], t["sin"] = torch.ones(keys, head_dim // 2), torch.zeros(keys, head_dim // 2)
    t["kv_stacked"] = torch.stack((t["k_bnhd"], t["v_bnhd"]), dim=2)
    t["k_packed"], t["v_packed"] = (t[f"{n}_bnhd"].view(-1, heads_kv, head_dim) for n in "kv")
    t["cu_q"] = torch.arange(batch + 1, dtype=torch.int32)
    t["cu_k"] = torch.arange(batch + 1, dtype=torch.int32) * keys
    t["output"] = torch.empty(batch + 3, heads_q, head_dim)  # vLLM's buffer, padded
    t["descale"] = torch.ones(1).expand(batch, heads_kv)
    return t


def entry_points(t: dict, keys: int) -> dict:
    heads_q, heads_kv = t["q"].shape[1], t["k"].shape[1]
    gqa = heads_q != heads_kv
    batch, head_dim = t["q"].shape[0], t["q"].shape[3]
    bhnd, bnhd = (t["q"], t["k"], t["v"]), (t["q_bnhd"], t["k_bnhd"], t["v_bnhd"])
    return {
        "torch_sdpa": lambda: F.scaled_dot_product_attention(*bhnd, enable_gqa=gqa),
        "sdpa": lambda: ipex_flash.scaled_dot_product_attention(*bhnd, enable_gqa=gqa),
        "op": lambda: torch.ops.ipex_flash.attention(*bhnd),
        "flash_attn_func": lambda: ipex_flash.flash_attn_func(*bnhd),
        "kvcache": lambda: ipex_flash.flash_attn_with_kvcache(*bnhd, cache_seqlens=t["seqlens"]),
        "kvcache_paged": lambda: ipex_flash.flash_attn_with_kvcache(
            t["q_bnhd"], t["k_pages"], t["v_pages"], cache_seqlens=t["seqlens"],
            block_table=t["block_table"]),
        "kvcache_append": lambda: ipex_flash.flash_attn_with_kvcache(
            t["q_bnhd"], t["k_pages"], t["v_pages"], t["k_last"], t["v_last"],
            cache_seqlens=t["seqlens_before_last"], block_table=t["block_table"]),
        "kvcache_rotary": lambda: ipex_flash.flash_attn_with_kvcache(
            t["q_bnhd"], t["k_pages"], t["v_pages"], t["k_last"], t["v_last"], t["cos"],
            t["sin"], cache_seqlens=t["seqlens_before_last"], block_table=t["block_table"]),
        "paged_varlen": lambda: ipex_flash.flash_attn_varlen_func(
            t["q_bnhd"].view(batch, heads_q, -1), t["k_pages"], t["v_pages"], t["cu_q"], t["cu_k"],
            1, keys, block_table=t["block_table"], seqused_k=t["seqlens"]),
        "vllm_call": lambda: ipex_flash.flash_attn_varlen_func(
            q=t["q_bnhd"].view(batch, heads_q, -1), k=t["k_pages"], v=t["v_pages"],
            out=t["output"][:batch], cu_seqlens_q=t["cu_q"], max_seqlen_q=1,
            seqused_k=t["seqlens"], max_seqlen_k=keys, softmax_scale=head_dim ** -0.5,
            causal=True, alibi_slopes=None, window_size=None, block_table=t["block_table"],
            softcap=0.0, scheduler_metadata=None, fa_version=2, q_descale=t["descale"],
            k_descale=t["descale"], v_descale=t["descale"], num_splits=0, s_aux=None),
        "kvcache_fa3": lambda: ipex_flash.flash_attn_with_kvcache(
            q=t["q_bnhd"].view(batch, heads_q, -1), k_cache=t["k_pages"], v_cache=t["v_pages"],
            page_table=t["block_table"], cache_seqlens=t["seqlens"], cu_seqlens_q=t["cu_q"],
            max_seqlen_q=1, softmax_scale=head_dim ** -0.5, causal=True, window_size=(-1, -1),
            softcap=0.0, return_softmax_lse=False, scheduler_metadata=None, num_splits=0,
            pack_gqa=None, sm_margin=0),
        "varlen": lambda: ipex_flash.flash_attn_varlen_func(
            t["q_bnhd"].view(batch, heads_q, -1), t["k_packed"], t["v_packed"], t["cu_q"],
            t["cu_k"], 1, keys),
        "kvpacked": lambda: ipex_flash.flash_attn_kvpacked_func(t["q_bnhd"], t["kv_stacked"]),
    }


def kernels_alone(t: dict, keys: int) -> dict:
    """C.flash_decode on prepared views, options and scratch, per layout: what the entry
    points' kernels cost without anything around them."""
    batch, heads_q, _, head_dim = t["q"].shape
    heads_kv = t["k"].shape[1]
    scale = head_dim ** -0.5
    layouts = {
        "bhnd": (t["q"], t["k"], t["v"], sdpa_options(t["q"], False, None, 0.0, None)),
        "bnhd": (*(t[n].transpose(1, 2) for n in ("q_bnhd", "k_bnhd", "v_bnhd")),
                 flash_options(None, None, 0, 0, scale, False, -1, -1, 0.0, None, 0.0, None)),
        "paged": (t["q_bnhd"].transpose(1, 2), t["k_pages"].transpose(1, 2),
                  t["v_pages"].transpose(1, 2),
                  cache_options(scale, False, -1, -1, 0.0, None, None, t["seqlens"], keys,
                                t["block_table"], PAGE)),
    }
    splits = C.decode_num_splits(batch, heads_kv, heads_q // heads_kv, head_dim, keys, 0)
    calls = {}
    for name, (q, k, v, options) in layouts.items():
        out, lse = torch.empty_like(q), torch.empty(batch, heads_q, 1)
        partial_out = torch.empty(batch, heads_q, 1, splits, head_dim)
        partial_lse = torch.empty(batch, heads_q, 1, splits)
        views = [launch.view(x) for x in (q, k, v, out, lse, partial_out, partial_lse)]
        kept = (out, lse, partial_out, partial_lse)  # the views point into them
        calls[name] = lambda views=views, options=options, kept=kept: C.flash_decode(
            *views, options, 0)
    return calls


def check_agreement(fns: dict, t: dict) -> None:
    """Every entry point computes the same attention (a benchmark of wrong results is none).
    One query row: every layout's output reshapes to (B, Hq * D) alike."""
    expected = fns["torch_sdpa"]().reshape(t["q"].shape[0], -1)
    for name, fn in fns.items():
        torch.testing.assert_close(fn().reshape(expected.shape), expected, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")
