"""FP8 KV caches on the matrix-engine forward (flash_fwd_matrix.hpp): its K/V pack converts
e4m3 / e5m2 to the queries' 16-bit dtype (exactly), and the descales fold into the score scale
and the final normalisation. Run with joint_matrix emulated (any machine; AMX's shape and DG2's
8-wide one) and on the engine where there is one, against the float64 reference of the
dequantised cache."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C

from helpers.cases import tiered
from helpers.fp8 import FP8, QUERY_DTYPES, check, check_cache_attention, quantised_cache
from helpers.matrix import (  # noqa: F401 (matrix_mode: a fixture)
    matrix_mode, needs_engine, skip_without_engine_tiles)

MODES = [pytest.param("16", marks=needs_engine), "emulate", "emulate8"]
FEATURE_OF = {torch.float8_e4m3fn: 64, torch.float8_e5m2: 128}  # params.hpp FEATURE_KV_*


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fp8", FP8)
def test_prefill_over_fp8_cache_takes_the_matrix_kernel(matrix_mode, mode, fp8):
    """The host plans the matrix kernel and a pack for the cache's FP8 type (not the 16-bit
    pack, which would copy the bytes as they are)."""
    matrix_mode(mode)
    plan = C.plan("forward", "", "bfloat16", 128, FEATURE_OF[fp8], 1, mode)
    assert plan["variant"].matrix_m > 0
    packs = [k for k in plan["kernels"] if "flash_fwd_pack_kv_kernel" in k]
    # The pack's arguments end with the cache's FP8 feature, V's head dim and the pack's tile
    # order: tile by tile (8 x 16) for the 8-wide register kernel, else row-major (0, 0).
    order = "8, 16" if mode == "emulate8" else "0, 0"
    assert len(packs) == 1 and packs[0].endswith(f", {FEATURE_OF[fp8]}, 128, {order}>")


@pytest.mark.parametrize("profile", [n for n in C.profile_names()
                                     if C.profile_limits(n)["matrix_by_default"]])
def test_gpus_take_it_where_decodes_have_the_decode_kernel(profile):
    """On XMX GPUs whose FP8 decodes run the general kernel (no 256-register file: DG2, Arrow
    Lake-H), FP8 keeps the vector forward: the matrix one would convert the whole cache for
    every decode step. Elsewhere FP8 prefills take XMX like 16-bit ones."""
    fp8_decode = C.profile_limits(profile)["large_grf"]
    for features in FEATURE_OF.values():
        plan = C.plan("forward", profile, "bfloat16", 128, features, 1, "auto")
        assert (plan["variant"].matrix_m > 0) == fp8_decode
    assert C.plan("forward", profile, "bfloat16", 128, 0, 1, "auto")["variant"].matrix_m > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fp8", FP8)
def test_every_bit_pattern_converts_exactly(matrix_mode, mode, fp8):
    """One key whose value row holds all 256 FP8 bit patterns: every query row's output is
    that row, exact in bfloat16 (NaN patterns give NaN)."""
    matrix_mode(mode)
    head_dim = 256
    v_cache = torch.arange(256, dtype=torch.uint8).view(fp8).reshape(1, 1, 1, head_dim)
    k_cache = torch.zeros(1, 1, 1, head_dim).to(fp8)
    q = torch.randn(1, 40, 1, head_dim, dtype=torch.bfloat16)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache)
    expected = v_cache.float().to(torch.bfloat16).expand(1, 40, 1, head_dim)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


# Default tier: bfloat16 queries (float16: long tier; test_fp8_kvcache runs both).
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", tiered(QUERY_DTYPES, [torch.bfloat16]))
@pytest.mark.parametrize("per_head,paged", [(False, False), (True, False), (True, True)])
def test_matches_reference_of_dequantised_cache(matrix_mode, mode, fp8, dtype, per_head, paged):
    skip_without_engine_tiles(mode, dtype)
    matrix_mode(mode)
    check_cache_attention(fp8, dtype, 70, (6, 2), per_head, paged)


@pytest.mark.parametrize("mode", ["emulate"])
@pytest.mark.parametrize("fp8", FP8)
# Default tier: an odd head dim on rows off their alignment; the long tier 80 and 100 too.
@pytest.mark.parametrize("head_dim,offset", tiered([(80, 0), (100, 0), (61, 1)], [(61, 1)],
                                                   multi=True))
def test_head_dims_and_unaligned_rows(matrix_mode, mode, fp8, head_dim, offset):
    """Head dims off the 32-deep steps (80), off the 64-wide buckets (100), and rows that do
    not start on a 4-byte boundary (a view one byte into its storage), which the pack reads
    element by element instead of four at a time; with a window and softcap."""
    matrix_mode(mode)
    batch, capacity, heads_kv = 2, 200, 2
    (k_cache, v_cache), (k_descale, v_descale), (k64, v64) = quantised_cache(
        batch, capacity, heads_kv, head_dim + offset, fp8, True)
    k_cache, v_cache = k_cache[..., offset:], v_cache[..., offset:]
    k64, v64 = k64[..., offset:], v64[..., offset:]
    q = torch.randn(batch, 50, 4, head_dim, dtype=torch.bfloat16)
    lengths = [200, 31]
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        window_size=(40, 0), softcap=5.0, k_descale=k_descale, v_descale=v_descale)
    check(out, q, k64, v64, lengths, torch.bfloat16, window_size=(40, 0), softcap=5.0)
