"""Property tests: hypothesis draws shapes (lengths either side of the tiles, 1 and 0
included), head dims, GQA ratios, dtypes and every score option of each entry point, and the
outputs and gradients must pass flash-attn's rule against float64 (helpers/property_rule.py). The
default tier draws a few examples from problems whose kernels the other tests compile; the
full tier (`-m full`) more, from everything (helpers/property_cases.py). Seeds are fixed (the
hypothesis profile in conftest.py), so a run is reproducible and a failure prints its case."""
import pytest
import torch
from hypothesis import given, settings

import ipex_flash
from ipex_flash.reference import flash_attn_reference
from helpers.caches import make_cache, paged_batch, to_paged
from helpers.cases import tiered
from helpers.property_cases import (
    TIERS, flash_attn_cases, kvcache_cases, paged_varlen_cases, sdpa_cases, varlen_cases)
from helpers.property_rule import assert_within_rule, attention, check_against_rule, flash_bias

TIER_PARAMS = tiered(["default", "full"], ["default"])


def run_property(check, cases, tier):
    """check every case hypothesis draws from cases(tier), with the tier's example count."""
    settings(max_examples=TIERS[tier].examples)(given(case=cases(TIERS[tier]))(check))()


def names_for(sinks):
    return ("q", "k", "v", "sinks" if sinks is not None else None)


def options_of(case, batch):
    """ALiBi slopes (batch, heads_q) and sinks (heads_q,) float32 as the case asks for."""
    slopes = torch.rand(batch, case["heads_q"]) * 0.3 if case["alibi"] else None
    sinks = torch.randn(case["heads_q"]) * 2 if case["sinks"] else None
    return slopes, sinks


def check_flash_attn_func(case):
    torch.manual_seed(case["seed"])
    dtype, batch = case["dtype"], case["batch"]
    q = torch.randn(batch, case["len_q"], case["heads_q"], case["head_dim"], dtype=dtype)
    k, v = (torch.randn(batch, case["len_k"], case["heads_kv"], case["head_dim"], dtype=dtype)
            for _ in range(2))
    slopes, sinks = options_of(case, batch)
    options = dict(causal=case["causal"], window_size=case["window"], softcap=case["softcap"],
                   alibi_slopes=slopes)
    bias = flash_bias(case["len_q"], case["len_k"], case["causal"], case["window"], slopes)
    check_against_rule(
        lambda q, k, v, s: ipex_flash.flash_attn_func(q, k, v, sinks=s, **options),
        lambda q, k, v, s, dt: attention(q, k, v, dt, bias, case["softcap"], s),
        [q, k, v, sinks], names_for(sinks), dtype, backward=True, generator=_generator(case))


def check_sdpa(case):
    torch.manual_seed(case["seed"])
    dtype, batch, n_q, n_k = case["dtype"], case["batch"], case["len_q"], case["len_k"]
    # (B, H, N, D) memory as models pass it; the helpers see it as (B, N, H, D) views.
    q = torch.randn(batch, case["heads_q"], n_q, case["head_dim"], dtype=dtype).transpose(1, 2)
    k, v = (torch.randn(batch, case["heads_kv"], n_k, case["head_dim"],
                        dtype=dtype).transpose(1, 2) for _ in range(2))
    shape = {"full": (batch, case["heads_q"], n_q, n_k), "per_batch": (batch, 1, n_q, n_k),
             "shared": (n_q, n_k)}[case["mask_shape"]]
    hidden = torch.rand(shape) < case["hidden_fraction"]
    mask = None
    if case["mask"] == "bool":
        mask = ~hidden
    elif case["mask"] != "none":
        mask_dtype = torch.float32 if case["mask"] == "float32" else dtype
        mask = (torch.randn(shape) * 2).masked_fill(hidden, float("-inf")).to(mask_dtype)
    sinks = torch.randn(case["heads_q"]) * 2 if case["sinks"] else None
    options = dict(is_causal=case["is_causal"], enable_gqa=case["heads_q"] != case["heads_kv"],
                   softcap=case["softcap"] or None)

    def kernel(q, k, v, s):
        out = ipex_flash.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask, sinks=s, **options)
        return out.transpose(1, 2)

    check_against_rule(
        kernel, lambda q, k, v, s, dt: attention(q, k, v, dt, mask, case["softcap"], s,
                                                 is_causal=case["is_causal"]),
        [q, k, v, sinks], names_for(sinks), dtype, backward=True, generator=_generator(case))


def pack(lengths, heads, head_dim, dtype):
    tensor = torch.randn(sum(lengths), heads, head_dim, dtype=dtype)
    offsets = torch.tensor([0] + list(lengths)).cumsum(0).to(torch.int32)
    return tensor, offsets


def per_sequence(q, k, v, cu_q, cu_k, case, slopes, sinks, dtype):
    """Each packed sequence's attention, packed again."""
    outs = []
    for b, (start_q, end_q, start_k, end_k) in enumerate(
            zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist())):
        bias = flash_bias(end_q - start_q, end_k - start_k, case["causal"], case["window"],
                          None if slopes is None else slopes[b:b + 1])
        outs.append(attention(q[None, start_q:end_q], k[None, start_k:end_k],
                              v[None, start_k:end_k], dtype, bias, case["softcap"], sinks)[0])
    return torch.cat(outs)


def check_varlen(case):
    torch.manual_seed(case["seed"])
    dtype, lens = case["dtype"], case["seq_lens"]
    q, cu_q = pack([n for n, _ in lens], case["heads_q"], case["head_dim"], dtype)
    k, cu_k = pack([n for _, n in lens], case["heads_kv"], case["head_dim"], dtype)
    v, _ = pack([n for _, n in lens], case["heads_kv"], case["head_dim"], dtype)
    slopes, sinks = options_of(case, len(lens))
    max_q, max_k = max(n for n, _ in lens), max(n for _, n in lens)
    options = dict(causal=case["causal"], window_size=case["window"], softcap=case["softcap"],
                   alibi_slopes=slopes)
    check_against_rule(
        lambda q, k, v, s: ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                                             sinks=s, **options),
        lambda q, k, v, s, dt: per_sequence(q, k, v, cu_q, cu_k, case, slopes, s, dt),
        [q, k, v, sinks], names_for(sinks), dtype, backward=True, generator=_generator(case))


def check_paged_varlen(case):
    """The serving call: flash_attn_varlen_func with block_table and seqused_k (forward only)."""
    torch.manual_seed(case["seed"])
    dtype, lens = case["dtype"], case["seq_lens"]
    q, k_pages, v_pages, table, cu_q, seqused, seqs = paged_batch(
        lens, case["heads_q"], case["heads_kv"], case["head_dim"], case["page_size"], dtype)
    slopes, sinks = options_of(case, len(lens))
    out = ipex_flash.flash_attn_varlen_func(
        q, k_pages, v_pages, cu_q, None, max(n for n, _ in lens), max(n for _, n in lens),
        causal=case["causal"], window_size=case["window"], softcap=case["softcap"],
        alibi_slopes=slopes, block_table=table, seqused_k=seqused, sinks=sinks)
    k, v = (torch.cat([s[i] for s in seqs]) for i in (1, 2))
    cu_k = torch.tensor([0] + [n for _, n in lens]).cumsum(0)
    truth, plain = (per_sequence(q, k, v, cu_q, cu_k, case, slopes, sinks, dt)
                    for dt in (torch.float64, dtype))
    assert_within_rule("out", out, truth, plain, dtype)


def check_kvcache(case):
    """flash_attn_with_kvcache on a paged cache (block_table), appending or not (forward)."""
    torch.manual_seed(case["seed"])
    dtype, batch, n_q = case["dtype"], case["batch"], case["len_q"]
    k_cache, v_cache = make_cache(batch, case["capacity"], case["heads_kv"], case["head_dim"],
                                  dtype)
    k_pages, v_pages, table = to_paged(k_cache, v_cache, case["page_size"])
    q = torch.randn(batch, n_q, case["heads_q"], case["head_dim"], dtype=dtype)
    new = [torch.randn(batch, n_q, case["heads_kv"], case["head_dim"], dtype=dtype)
           for _ in range(2)] if case["append"] else [None, None]
    seqlens = torch.tensor(case["cache_seqlens"], dtype=torch.int32)
    slopes, sinks = options_of(case, batch)
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_pages, v_pages, *new, cache_seqlens=seqlens, block_table=table,
        causal=case["causal"], window_size=case["window"], softcap=case["softcap"],
        alibi_slopes=slopes, sinks=sinks)

    def reference(dt):
        outs = []
        for b, cached in enumerate(case["cache_seqlens"]):
            k, v = k_cache[b:b + 1, :cached], v_cache[b:b + 1, :cached]
            if case["append"]:
                k, v = torch.cat([k, new[0][b:b + 1]], 1), torch.cat([v, new[1][b:b + 1]], 1)
            bias = flash_bias(n_q, k.shape[1], case["causal"], case["window"],
                              None if slopes is None else slopes[b:b + 1])
            outs.append(attention(q[b:b + 1].to(dt), k.to(dt), v.to(dt), dt, bias,
                                  case["softcap"], sinks))
        return torch.cat(outs)

    assert_within_rule("out", out, reference(torch.float64), reference(dtype), dtype)


def _generator(case):
    """The output gradient's generator, from the case's seed."""
    return torch.Generator().manual_seed(case["seed"] + 1)


@pytest.mark.parametrize("tier", TIER_PARAMS)
@pytest.mark.parametrize("check,cases", [
    (check_flash_attn_func, flash_attn_cases), (check_sdpa, sdpa_cases),
    (check_varlen, varlen_cases), (check_paged_varlen, paged_varlen_cases),
    (check_kvcache, kvcache_cases)],
    ids=["flash_attn_func", "sdpa_masks", "varlen", "paged_varlen", "kvcache_paged"])
def test_entry_point(check, cases, tier):
    run_property(check, cases, tier)


@settings(max_examples=30)
@given(case=flash_attn_cases(TIERS["full"]))
def test_flash_bias_encodes_flash_attn_semantics(case):
    """The helpers' truth (sdpa_reference with flash_bias) is flash_attn_reference's (no
    kernel runs: every tier draws everything)."""
    torch.manual_seed(case["seed"])
    q = torch.randn(case["batch"], case["len_q"], case["heads_q"], 8, dtype=torch.float64)
    k, v = (torch.randn(case["batch"], case["len_k"], case["heads_kv"], 8,
                        dtype=torch.float64) for _ in range(2))
    slopes = torch.rand(case["batch"], case["heads_q"]) * 0.3 if case["alibi"] else None
    bias = flash_bias(case["len_q"], case["len_k"], case["causal"], case["window"], slopes)
    want, _ = flash_attn_reference(
        q, k, v, case["causal"], case["window"], case["softcap"], slopes)
    torch.testing.assert_close(attention(q, k, v, torch.float64, bias, case["softcap"]), want,
                               rtol=1e-12, atol=1e-12)
