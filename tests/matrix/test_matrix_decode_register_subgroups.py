"""The decode kernel's register form with its work-group split into sub-groups
(decode/xmx_kernel.hpp, SUBGROUPS > 1): where O of a K/V head's rows would pass 64 registers in
one sub-group, each sub-group takes a share of O's columns and of a block's keys for S, and the
rows' block maxima and sums meet in SLM. MLA's 576/512 decode over one latent cache (16 rows:
eight sub-groups, 256 keys a block; 8 rows: four), head dim 256 with 16 rows and 512 with 8
(four); joint_matrix emulated (IPEX_FLASH_MATRIX=emulate), against the float64 reference."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.ops import launch
from ipex_flash.reference import flash_attn_reference

from helpers.caches import make_cache, to_paged
from helpers.matrix import matrix_mode  # noqa: F401 (a fixture)
from helpers.reference import LSE_TOLERANCE, OUTPUT_TOLERANCE, check_against_reference

VALUE_DIM = 256  # FEATURE_VALUE_DIM (common/features.hpp)


def register_subgroups(head_dim, rows, features=0, head_dim_v=0):
    plan = C.plan("decode", "", "bfloat16", head_dim, features, rows, "emulate", head_dim_v)
    assert plan["variant"].matrix_registers, plan["reasons"]
    return plan["variant"].value_split


@pytest.mark.parametrize("heads,new_tokens,subgroups", [(16, 1, 8), (8, 1, 4), (4, 3, 8)],
                         ids=["16_heads", "8_heads", "4_heads_3_tokens"])
@pytest.mark.parametrize("paged,num_splits", [(True, 1), (False, 2)],
                         ids=["paged", "contiguous_splits"])
def test_mla_latent_cache(matrix_mode, heads, new_tokens, subgroups, paged, num_splits):
    """q (B, Nq, H, 576) against one latent cache, v its first 512 columns, as vLLM and FlashMLA
    pass it; DeepSeek's softmax scale; causal over the drafts."""
    matrix_mode("emulate")
    torch.manual_seed(0)
    d, d_v, lengths, capacity = 576, 512, [37, 300], 320  # (blocks of 256 or 128 keys)
    assert register_subgroups(d, heads * new_tokens, VALUE_DIM, d_v) == subgroups
    latent = torch.randn(len(lengths), capacity, 1, d, dtype=torch.bfloat16)
    cache, extra = latent, {}
    if paged:
        cache, _, extra["block_table"] = to_paged(latent, latent, 32)
    q = torch.randn(len(lengths), new_tokens, heads, d, dtype=torch.bfloat16)
    views = (launch.view(t.transpose(1, 2)) for t in (q, cache, cache[..., :d_v]))
    views = list(views)
    assert C.flash_decode_supported(*views, launch.queue_handle(q.device))
    variant = C.flash_decode_variant(*views, launch.queue_handle(q.device))
    assert variant.matrix_registers and variant.value_split == subgroups  # what the call runs
    scale = 1.0 / math.sqrt(192)
    before = cache.clone()
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, cache, cache[..., :d_v], cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        softmax_scale=scale, causal=True, return_softmax_lse=True, num_splits=num_splits,
        **extra)
    assert torch.equal(cache, before)
    rtol, atol = OUTPUT_TOLERANCE[torch.bfloat16]
    for b, length in enumerate(lengths):
        keys = latent[b:b + 1, :length]
        ref_out, ref_lse = flash_attn_reference(q[b:b + 1], keys, keys[..., :d_v], causal=True,
                                                scale=scale)
        torch.testing.assert_close(out[b:b + 1].double(), ref_out, rtol=rtol, atol=atol)
        torch.testing.assert_close(lse[b:b + 1].double(), ref_lse, rtol=LSE_TOLERANCE[0],
                                   atol=LSE_TOLERANCE[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim,heads,subgroups", [(256, (16, 1), 4), (512, (16, 2), 4)],
                         ids=["d256_16_rows", "d512_8_rows"])
def test_wide_heads(matrix_mode, dtype, head_dim, heads, subgroups):
    """Head dims past the one-sub-group limit with softcap and ALiBi (each query head's slope),
    a window, and a last key block of 3 keys: four sub-groups."""
    matrix_mode("emulate")
    torch.manual_seed(0)
    heads_q, heads_kv = heads
    rows = heads_q // heads_kv
    assert register_subgroups(head_dim, rows, 3) == subgroups
    lengths = [5, 131]
    k, v = make_cache(len(lengths), 160, heads_kv, head_dim, dtype)
    q = torch.randn(len(lengths), 1, heads_q, head_dim, dtype=dtype)
    slopes = torch.rand(len(lengths), heads_q) * 0.3
    options = dict(causal=True, softcap=6.0, window_size=(90, 0))
    views = [launch.view(t.transpose(1, 2)) for t in (q, k, v)]
    assert C.flash_decode_supported(*views, launch.queue_handle(q.device))
    assert C.flash_decode_variant(*views, launch.queue_handle(q.device)).value_split == subgroups
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32), alibi_slopes=slopes,
        return_softmax_lse=True, **options)
    check_against_reference(out, lse, q, k, v, lengths, dtype, alibi_slopes=slopes, **options)
