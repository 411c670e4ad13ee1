"""The matrix-engine forward kernel (flash_fwd_matrix.hpp: joint_matrix, AMX on this project's
Xeons, XMX on Intel GPUs) and the decode kernel's matrix scores: their tile shapes forced one by
one through IPEX_FLASH_MATRIX, against the float64 reference and against the vector kernels;
the same kernels with joint_matrix emulated (IPEX_FLASH_MATRIX=emulate), which run on any
machine; the selection rules; and a compile check that runs on any machine."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference

from helpers.cases import random_qkv, tiered
from helpers.caches import cache_in_layout, to_paged
from helpers.matrix import (  # noqa: F401 (matrix_mode: a fixture)
    HAS_MATRIX_ENGINE, TILE_MODES, matrix_mode, needs_engine)
from helpers.reference import assert_matches_reference, check_against_reference

# Modes that run the matrix kernels: those tile shapes on the engine (skipped without one), and
# with joint_matrix emulated by sub-group arithmetic (matrix_tile.hpp), which runs anywhere:
# AMX's shape (emulate: N = 16) and DG2 / Arrow Lake-H's XMX shape (emulate8: N = 8 with
# sub-group 8, M = 8, K = 16), so the kernels' packing, tiling, masks and softmax are tested
# on every machine in both widths.
EMULATED = ["emulate", "emulate8"]
RUN_MODES = [pytest.param(mode, marks=needs_engine) for mode in TILE_MODES] + EMULATED
ONE_RUN_MODE = [pytest.param("16", marks=needs_engine), "emulate"]


@pytest.mark.parametrize("profile, wide", [("pvc", True), ("bmg", True), ("lnl", True),
                                          ("dg2", False), ("arl-h", False)])
def test_forward_kernel_per_gpu(profile, wide):
    """GPUs with 256 registers per thread plan the forward and the backward's dQ (d <= 128)
    and dK/dV (d <= 128) with their tiles in registers; the 8-wide engines of DG2 and Arrow
    Lake-H (128 registers of 32 bytes) the forward, past d = 64 with two sub-groups per query
    rows, each holding half of O^T (a whole one fills their registers at 128), and the
    backward's dQ and dK/dV up to d = 64 (two sub-groups per rows or keys, each with a share of
    the resident accumulators); so do the emulated shapes of each (emulate: sub-group 16,
    emulate8: DG2's)."""
    for dtype in ("bfloat16", "float16"):
        for head_dim in (64, 128):
            plan = C.plan("forward", profile, dtype, head_dim, 0, 1, "1")
            assert plan["variant"].matrix_m > 0 and plan["variant"].matrix_registers
            assert plan["header"] == "programs/flash_fwd_matrix_registers.hpp"
            split = 1 if wide or head_dim <= 64 else 2
            assert plan["variant"].value_split == split
            assert plan["kernels"][0].endswith(f", {head_dim}, {split}>")
            # The 8-wide kernel's pack is in tile order (8 x 16 tiles), 16 keys a block.
            assert plan["kernels"][1].endswith(", 0, 0>" if wide else ", 8, 16>")
            assert (plan["variant"].block_n == 16) == (not wide)
            # With softcap, ALiBi and a mask (FEATURE_* 1 | 2 | 4) the 8-wide engines stage
            # their tiles through SLM.
            scored = C.plan("forward", profile, dtype, head_dim, 7, 1, "1")["variant"]
            assert scored.matrix_registers == wide
            backward = C.plan("backward", profile, dtype, head_dim, 0, 1, "1")
            dq_registers = wide or head_dim <= 64
            assert backward["variant"].matrix_registers == dq_registers
            assert backward["variant"].dkdv_registers == dq_registers
            assert any("flash_bwd_dq_matrix_registers_kernel" in k
                       for k in backward["kernels"]) == dq_registers
            # dK/dV, dQ: one sub-group per keys or rows where 256 registers hold the shares,
            # two on the 8-wide engines at d = 64.
            if dq_registers:
                shares = "1" if wide else "2"
                assert [k[-2] for k in backward["kernels"][-2:]] == [shares, shares], backward
            # The backward's packs: tile by tile on the 8-wide engines (up to d = 128).
            assert backward["kernels"][1].endswith(", 0, 0>" if wide else ", 8, 16>")
            assert any("flash_bwd_dkdv_matrix_registers_kernel" in k
                       for k in backward["kernels"]) == dq_registers
    # Above head dim 128 the accumulators would not fit.
    assert not C.plan("forward", "bmg", "bfloat16", 256, 0, 1, "1")["variant"].matrix_registers
    assert not C.plan("backward", "bmg", "bfloat16", 160, 0, 1, "1")["variant"].matrix_registers
    for mode in ("emulate", "emulate8"):
        for head_dim in (64, 128):
            assert C.plan("forward", "", "bfloat16", head_dim, 0, 1, mode)["variant"] \
                .matrix_registers
        assert C.plan("backward", "", "bfloat16", 64, 0, 1, mode)["variant"].matrix_registers
        assert C.plan("backward", "", "bfloat16", 128, 0, 1, mode)["variant"].matrix_registers \
            == (mode == "emulate")


# Default tier: the common and a padded head dim above 128 (80, 16-deep steps, runs in
# test_emulated_matches_reference); the long tier all.
@pytest.mark.parametrize("len_q,len_k", [(1, 1), (17, 300), (127, 127), (300, 113)])
@pytest.mark.parametrize("head_dim", tiered([16, 40, 64, 80, 128, 200], [128, 200]))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", RUN_MODES)
def test_matches_reference(matrix_mode, mode, causal, head_dim, len_q, len_k):
    matrix_mode(mode)
    q, k, v = random_qkv(2, 4, 2, len_q, len_k, head_dim, torch.bfloat16)
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16)


# Emulated, float16 too (AMX takes only bfloat16 here): sizes that are no multiple of the 64-row
# blocks, GQA 3, head dims 80 (16-deep steps) and 64, 128 (32-deep; long tier: the default
# runs 128 in test_matches_reference).
@pytest.mark.parametrize("len_q,len_k", [(77, 130), (130, 77)])
@pytest.mark.parametrize("head_dim", tiered([64, 80, 128], [80]))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", EMULATED)
def test_emulated_matches_reference(matrix_mode, mode, dtype, causal, head_dim, len_q, len_k):
    matrix_mode(mode)
    q, k, v = random_qkv(2, 6, 2, len_q, len_k, head_dim, dtype)
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


def test_emulated_variants_and_build_options(matrix_mode):
    """emulate picks AMX's tile shape on any device, marks the variants, and builds them with
    IPEX_FLASH_MATRIX_EMULATE (kept apart from real matrix builds in the kernel caches, whose
    keys include the options); float32 keeps the vector kernels."""
    for family in ("forward", "decode"):
        plan = C.plan(family, "", "float16", 128, 0, 4, "emulate")
        variant = plan["variant"]
        assert (variant.matrix_m, variant.matrix_k, variant.matrix_emulated) == (16, 32, True)
        assert "-DIPEX_FLASH_MATRIX_EMULATE" in plan["options"]
        for dtype, mode in [("float32", "emulate"), ("bfloat16", "1"), ("bfloat16", "0")]:
            plan = C.plan(family, "", dtype, 128, 0, 4, mode)
            assert not plan["variant"].matrix_emulated
            assert "-DIPEX_FLASH_MATRIX_EMULATE" not in plan["options"]
        assert C.plan(family, "", "float32", 128, 0, 4, "emulate")["variant"].matrix_m == 0
    # 16-deep steps where 32 does not divide the head dim (the decode kernel pads 80 to 96).
    assert C.plan("forward", "", "bfloat16", 80, 0, 1, "emulate")["variant"].matrix_k == 16
    # emulate8: DG2's shape for the forward and backward, built for sub-group 8 (the last
    # template argument); the decode kernel's scores stay 16 wide (its sub-group), so there it
    # keeps the vector scores.
    for family in ("forward", "backward"):
        plan = C.plan(family, "", "bfloat16", 128, 0, 1, "emulate8")
        variant = plan["variant"]
        assert (variant.matrix_m, variant.matrix_k, variant.matrix_n) == (8, 16, 8)
        assert variant.matrix_emulated and "-DIPEX_FLASH_MATRIX_EMULATE" in plan["options"]
        assert any(", 8, 16, 8>" in k or ", 8, 16, 8, " in k for k in plan["kernels"])
    assert C.plan("forward", "", "bfloat16", 128, 0, 1, "emulate")["variant"].matrix_n == 16
    decode = C.plan("decode", "", "bfloat16", 128, 0, 4, "emulate8")
    assert decode["variant"].matrix_m == 0 and decode["kernels"][0].endswith(", 0, 0, 16>")


@pytest.mark.parametrize("mode", RUN_MODES)
def test_selected_and_distinct_from_vector_kernel(matrix_mode, mode):
    """The forced mode really builds the matrix variant, and its output differs from the
    vector kernel's (it rounds P to bfloat16 before P.V) while both match the reference."""
    matrix_mode(mode)
    variant = C.warmup_fwd("bfloat16", 64, 0)
    height = {"emulate": 16, "emulate8": 8}.get(mode) or int(mode)
    # DG2's shape takes only 16-deep steps.
    assert (variant.matrix_m, variant.matrix_k) == (height, 16 if mode == "emulate8" else 32)
    assert variant.matrix_emulated == (mode in EMULATED)
    assert C.warmup_fwd("bfloat16", 80, 0).matrix_k == 16  # 80 is not a multiple of 32
    q, k, v = random_qkv(1, 2, 2, 200, 200, 64, torch.bfloat16)
    out_matrix = ipex_flash.attention(q, k, v)
    matrix_mode("0")
    assert C.warmup_fwd("bfloat16", 64, 0).matrix_m == 0
    out_vector = ipex_flash.attention(q, k, v)
    assert not torch.equal(out_matrix, out_vector)
    ref_out, _ = attention_reference(q, k, v)
    for out in (out_matrix, out_vector):
        assert_matches_reference(out, None, ref_out, None, torch.bfloat16)


# One sub-group per query rows (d <= 64) and two, each with half of O^T (56 pads to 64; 80
# and 128 split); off the 16-key blocks, GQA 3, windows both sides and bottom-right causal.
@pytest.mark.parametrize("head_dim", [56, 80, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_eight_wide_register_forward(matrix_mode, dtype, head_dim):
    """emulate8 runs the forward that DG2 and Arrow Lake-H keep in registers, its K/V pack in
    tile order, against float64 with flash-attn's masks; the LSE too (written by one of the two
    sub-groups that share rows)."""
    from ipex_flash.reference import flash_attn_reference
    matrix_mode("emulate8")
    dtype_name = str(dtype).removeprefix("torch.")
    variant = C.plan("forward", "", dtype_name, head_dim, 0, 1, "emulate8")["variant"]
    assert variant.matrix_registers and variant.matrix_n == 8
    assert variant.value_split == (1 if head_dim <= 64 else 2)
    q, k, v = (t.transpose(1, 2) for t in random_qkv(2, 6, 2, 75, 101, head_dim, dtype))
    for kwargs in (dict(causal=True), dict(window_size=(23, 9)), dict(causal=False)):
        out, lse, _ = ipex_flash.flash_attn_func(q, k, v, return_attn_probs=True, **kwargs)
        ref_out, ref_lse = flash_attn_reference(q, k, v, **kwargs)
        assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


# 40 pads to 48: three tiles of O^T per sub-group; 96: three sub-groups of four tiles each.
@pytest.mark.parametrize("head_dim", [40, pytest.param(64, marks=pytest.mark.full), 80, 96,
                                      pytest.param(128, marks=pytest.mark.full)])
def test_eight_wide_register_forward_with_alibi_and_masks(matrix_mode, head_dim):
    """With ALiBi or a user's mask (bool or float) the 8-wide register forward runs with the
    fewest sub-groups per query rows whose shares of O^T are whole tiles, two at least, of at
    most 40 rows: two up to d = 80, three at 96, four at 128 (16 and 112 keep the SLM-staged
    kernel); softcap alone splits as no score change does, softcap with either the
    SLM-staged kernel. Both masks, ALiBi and softcap against float64."""
    from ipex_flash.reference import flash_attn_reference
    matrix_mode("emulate8")
    shares = {40: 2, 64: 2, 80: 2, 96: 3, 128: 4}[head_dim]
    for features, registers in ((2, True), (4, True), (8, True), (2 | 4, True), (1 | 2, False),
                                (1 | 8, False)):
        variant = C.plan("forward", "", "bfloat16", head_dim, features, 1, "emulate8")["variant"]
        assert variant.matrix_registers == registers, features
        assert variant.value_split == (shares if registers else 1), features
    for odd in (16, 112):
        variant = C.plan("forward", "", "bfloat16", odd, 2, 1, "emulate8")["variant"]
        assert not variant.matrix_registers and variant.value_split == 1
    for softcap_dim in (16, 112, head_dim):
        variant = C.plan("forward", "", "bfloat16", softcap_dim, 1, 1, "emulate8")["variant"]
        assert variant.matrix_registers
        assert variant.value_split == (1 if softcap_dim <= 64 else 2), softcap_dim
    dtype = torch.bfloat16
    q, k, v = random_qkv(2, 6, 2, 75, 101, head_dim, dtype)
    keep = torch.rand(2, 1, 75, 101) > 0.3
    keep[..., 0] = True  # every row sees a key
    for mask in (keep, torch.where(keep, torch.randn(2, 1, 75, 101), float("-inf"))):
        out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), attn_mask=mask if mask.dtype == torch.bool
            else mask.double(), enable_gqa=True)
        assert_matches_reference(out, None, ref, None, dtype)
    slopes = torch.rand(6)
    qf, kf, vf = (t.transpose(1, 2) for t in (q, k, v))
    out, lse, _ = ipex_flash.flash_attn_func(qf, kf, vf, causal=True, alibi_slopes=slopes,
                                             return_attn_probs=True)
    ref_out, ref_lse = flash_attn_reference(qf, kf, vf, causal=True, alibi_slopes=slopes)
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)
    out, lse, _ = ipex_flash.flash_attn_func(qf, kf, vf, causal=True, softcap=2.5,
                                             return_attn_probs=True)
    ref_out, ref_lse = flash_attn_reference(qf, kf, vf, causal=True, softcap=2.5)
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("mode", RUN_MODES)
def test_options_through_flash_attn_api(matrix_mode, mode):
    """Windows, softcap, ALiBi and bottom-right causal masks take the same kernel."""
    from ipex_flash.reference import flash_attn_reference
    matrix_mode(mode)
    q, k, v = (t.transpose(1, 2) for t in random_qkv(2, 4, 2, 90, 150, 64, torch.bfloat16))
    slopes = torch.rand(4)
    kwargs = dict(causal=True, window_size=(40, 0), softcap=30.0, alibi_slopes=slopes)
    out = ipex_flash.flash_attn_func(q, k, v, **kwargs)
    ref = flash_attn_reference(q, k, v, **kwargs)
    ref = ref[0] if isinstance(ref, tuple) else ref
    torch.testing.assert_close(out.double(), ref.double(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ONE_RUN_MODE + ["emulate8"])  # emulate8: the 8-wide registers
def test_dropout_applies_the_reported_mask(matrix_mode, mode, causal):
    from ipex_flash.ops import launch
    from helpers.dropout import reference_with_mask
    matrix_mode(mode)
    p = 0.3
    q, k, v = random_qkv(2, 4, 2, 45, 70, 64, torch.bfloat16)
    seed = launch.draw_dropout_seed(q.device)
    keep = torch.ops.ipex_flash.dropout_mask(seed, [2, 4, 45, 70], p)
    out, _ = torch.ops.ipex_flash.attention_forward(q, k, v, causal, None, p, seed)
    ref = reference_with_mask(q.double(), k.double(), v.double(), keep, p, causal)
    assert_matches_reference(out, None, ref, None, torch.bfloat16)


def test_float32_never_takes_it(matrix_mode):
    matrix_mode("1" if HAS_MATRIX_ENGINE else "0")
    assert C.warmup_fwd("float32", 64, 0).matrix_m == 0


def test_forced_on_float16_runs_or_says_why(matrix_mode):
    """float16 tiles need AMX-FP16 (Granite Rapids) or an Intel GPU. With a tile height named
    (IPEX_FLASH_MATRIX=16) the call either runs the matrix kernel correctly or raises an error
    that names the missing engine; with "1" it runs, on the vector kernel where the engine is
    missing."""
    q, k, v = random_qkv(1, 2, 1, 40, 50, 32, torch.float16)
    ref_out, _ = attention_reference(q, k, v)
    matrix_mode("1")
    assert_matches_reference(ipex_flash.attention(q, k, v), None, ref_out, None, torch.float16)
    matrix_mode("16")
    try:
        out = ipex_flash.attention(q, k, v)
    except RuntimeError as e:
        assert "IPEX_FLASH_MATRIX=16" in str(e) and "no matrix engine for float16" in str(e)
        return
    assert_matches_reference(out, None, ref_out, None, torch.float16)


def test_bad_mode_is_rejected(matrix_mode):
    matrix_mode("fast")
    q, k, v = random_qkv(1, 1, 1, 8, 8, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="IPEX_FLASH_MATRIX must be auto, 0, 1, 8, 16, emulate or emulate8"):
        ipex_flash.attention(q, k, v)


def decode_cache(layout, batch, capacity, heads_kv, head_dim, page_size, dtype):
    """A cache for flash_attn_with_kvcache: (k, v, extra kwargs, (k, v) as contiguous
    (B, N, H, D) for the reference)."""
    k, v = cache_in_layout("head_major" if layout == "head_major" else "contiguous", batch,
                           capacity, heads_kv, head_dim, dtype)
    if layout != "paged":
        return k, v, {}, (k, v)
    k_pages, v_pages, table = to_paged(k, v, page_size)
    return k_pages, v_pages, {"block_table": table}, (k, v)


# Decode with the scores on the matrix engine (flash_decode.hpp, MATRIX_M > 0): K tiles read in
# place (contiguous or head-major caches, pages: powers of two >= 16, so whole 16-row tiles) or
# staged through SLM (a partial last block, head dim 80 padded to 96); several K/V heads
# per Q^T tile (GQA 4: four heads' rows fill its 16 columns), a partial head group (6 heads
# at head dim 256), 3 new tokens x GQA 4 = 12 rows; the score options.
DECODE_CASES = {
    "contiguous_partial_group": dict(layout="contiguous", heads=(24, 6), head_dim=256),
    "head_major": dict(layout="head_major", heads=(32, 8), head_dim=128),
    "padded_dim": dict(layout="contiguous", heads=(8, 2), head_dim=80),
    "pages_of_16": dict(layout="paged", heads=(8, 2), head_dim=64, page_size=16),
    "three_tokens_causal": dict(layout="contiguous", heads=(8, 2), head_dim=64, new_tokens=3,
                                options=dict(causal=True)),
    "softcap_alibi_window": dict(layout="contiguous", heads=(8, 2), head_dim=128,
                                 options=dict(causal=True, softcap=5.0, window_size=(100, 0),
                                              alibi=True)),
}


def run_decode_case(case, dtype=torch.bfloat16):
    lengths = [37, 300]
    heads_q, heads_kv = case["heads"]
    k, v, paging, (k_ref, v_ref) = decode_cache(case["layout"], len(lengths), 336, heads_kv,
                                                case["head_dim"], case.get("page_size", 16), dtype)
    options = dict(case.get("options", {}))
    slopes = torch.rand(len(lengths), heads_q) * 0.2 if options.pop("alibi", False) else None
    q = torch.randn(len(lengths), case.get("new_tokens", 1), heads_q, case["head_dim"],
                    dtype=dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    out, lse = ipex_flash.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens,
                                                  return_softmax_lse=True, alibi_slopes=slopes,
                                                  **paging, **options)
    for b, length in enumerate(lengths):  # ALiBi slopes are per sequence
        check_against_reference(out[b:b + 1], lse[b:b + 1], q[b:b + 1], k_ref[b:b + 1],
                                v_ref[b:b + 1], [length], dtype, **options,
                                alibi_slopes=None if slopes is None else slopes[b:b + 1])
    return out, lse


# bfloat16 in every mode; float16 emulated (AMX takes only bfloat16 here).
# (emulate8 is not among them: the decode kernel's scores take only N = 16, its sub-group, and
# test_emulated_variants_and_build_options checks that emulate8 leaves them on the vector units.)
DECODE_RUNS = [pytest.param(mode, torch.bfloat16, marks=needs_engine, id=mode)
               for mode in TILE_MODES + ["0"]]
DECODE_RUNS += [pytest.param("emulate", dtype, id=f"emulate-{str(dtype)[6:]}")
                for dtype in (torch.bfloat16, torch.float16)]


@pytest.mark.parametrize("mode,dtype", DECODE_RUNS)
@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_matches_reference(matrix_mode, mode, dtype, case):
    matrix_mode(mode)
    torch.manual_seed(0)
    run_decode_case(DECODE_CASES[case], dtype)


@pytest.mark.parametrize("mode", ONE_RUN_MODE)
def test_decode_takes_matrix_path(matrix_mode, mode):
    """Forced on and off on the same inputs: both match the reference, and their log-sum-exps
    differ in the last bits (another summation order), so the forced mode was not ignored."""
    matrix_mode(mode)
    assert C.warmup_decode("bfloat16", 128, 4, 0).matrix_emulated == (mode == "emulate")
    results = []
    for run_mode in (mode, "0"):
        matrix_mode(run_mode)
        torch.manual_seed(0)
        results.append(run_decode_case(DECODE_CASES["head_major"]))
    assert not torch.equal(results[0][1], results[1][1])


def test_matrix_kernel_compiles():
    """The kernel source goes through the full DPC++ front end for this machine's SYCL CPU
    device, in a child process: where the CPU runtime targets AMX it must build and yield
    the kernel; elsewhere (SYCL_RUNTIME.md: no AMX) the build must pass the front end (a type
    error fails it) even though the bundle then holds no kernel."""
    # The last argument is the tile width N = the sub-group size: 16, or 8 (DG2's XMX shape).
    fwd = "ipex_flash::flash_fwd_matrix_kernel<ipex_flash::bfloat16_bits"
    names = [("programs/flash_fwd_matrix.hpp", f"{fwd}, {d}, 64, 64, {f}, {m}, {k}, {n}>")
             for d, f, m, k, n in [(64, 0, 16, 32, 16), (80, 3, 8, 16, 16), (128, 1, 8, 16, 16),
                                   (128, 1, 8, 16, 8)]]
    names += [("programs/flash_decode.hpp",
               f"ipex_flash::flash_decode_kernel<ipex_flash::bfloat16_bits, {d}, {r}, 16, {f}, {m}, {k}, 16>")
              for d, r, f, m, k in [(128, 4, 0, 16, 32), (96, 16, 3, 8, 16)]]
    script = textwrap.dedent(f"""
        from ipex_flash._runtime import C
        for source, name in {names!r}:
            try:
                C.build_kernel(source, name)
                print("BUILT", name)
            except RuntimeError as e:
                print("FAILED", name, str(e))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "IPEX_FLASH_QUIET": "1"},
                            cwd=tempfile.gettempdir())  # the installed package, not the source tree
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(lines) == len(names), result.stdout + result.stderr[-3000:]
    for line in lines:
        assert "Device compilation failed" not in line, line
        if HAS_MATRIX_ENGINE:
            assert line.startswith("BUILT"), line


@pytest.mark.parametrize("mode", ONE_RUN_MODE)
def test_forward_scratch_is_checked(matrix_mode, mode):
    """The matrix kernel reads K and V from a packed copy in the scratch Python allocates
    (launch.flash_fwd): its size follows from the problem, and a short one is refused before
    anything runs."""
    from ipex_flash.ops import launch
    from ipex_flash.ops.attention_forward import sdpa_options
    matrix_mode(mode)
    q, k, v = random_qkv(2, 4, 2, 30, 100, 40, torch.bfloat16)
    options = sdpa_options(q, False, None, 0.0, None)
    views = [launch.view(t) for t in (q, k, v)]
    # 2 sequences x 2 K/V heads x 2 blocks of 64 keys x (K + V^T) x 64 x 48 (head dim padded to
    # 48) x 2 bytes.
    assert C.fwd_scratch_bytes(*views, options, 0) == 2 * 2 * 2 * 2 * 64 * 48 * 2
    out, lse = torch.zeros_like(q), torch.zeros(2, 4, 30)
    short = torch.empty(2 * 2 * 2 * 2 * 64 * 48 * 2 - 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="scratch must be a uint8 tensor of at least"):
        C.flash_fwd(*views, launch.view(out), launch.view(lse), launch.view(short), options, 0)
    assert not out.any()
    matrix_mode("0")
    assert C.fwd_scratch_bytes(*views, options, 0) == 0


LAYOUT_CHILD = """
import json, warnings
import torch
import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, n, 64, dtype=torch.bfloat16) for n in (70, 90, 90))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = ipex_flash.attention(q, k, v, causal=True)
ref, _ = attention_reference(q, k, v, causal=True)
print(json.dumps({"error": (out.double() - ref).abs().max().item(),
                  "registers": C.warmup_fwd("bfloat16", 64, 0).matrix_registers,
                  "warnings": [str(w.message) for w in caught if "layout" in str(w.message)]}))
"""


@pytest.mark.parametrize("mismatch", [False, True])
@pytest.mark.parametrize("mode", ["emulate", "emulate8"])  # surfaces row-major, in tile order
def test_layout_probe_guards_the_register_kernels(mode, mismatch, tmp_path):
    """Before the register kernels' first use the engine's tile layout is probed; where it
    differs (the seam IPEX_FLASH_TEST_LAYOUT_MISMATCH makes the probe expect another) the call
    runs the SLM-staged kernel, correctly, with one warning naming the check."""
    env = dict(os.environ, IPEX_FLASH_MATRIX=mode, IPEX_FLASH_CACHE_DIR=str(tmp_path),
               IPEX_FLASH_TEST_LAYOUT_MISMATCH="1" if mismatch else "0")
    done = subprocess.run([sys.executable, "-c", LAYOUT_CHILD], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] < 2e-2
    assert result["registers"] == (not mismatch)
    assert len(result["warnings"]) == (1 if mismatch else 0), result["warnings"]
    if mismatch:
        assert "tile-layout check" in result["warnings"][0]
