"""The matrix-engine forward with its tiles in registers: which GPUs plan it for which head dims
(and the backward's register kernels), the 8-wide form of DG2 and Arrow Lake-H run with
joint_matrix emulated (IPEX_FLASH_MATRIX=emulate8) against float64 with flash-attn's masks,
ALiBi, softcap and SDPA's masks, and the tile-layout probe that guards the register kernels."""
import json
import os
import subprocess
import sys

import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C

from helpers.cases import random_qkv
from helpers.matrix import matrix_mode  # noqa: F401 (a fixture)
from helpers.reference import assert_matches_reference


@pytest.mark.parametrize("profile, wide", [("pvc", True), ("bmg", True), ("lnl", True),
                                          ("dg2", False), ("arl-h", False)])
def test_forward_kernel_per_gpu(profile, wide):
    """GPUs with 256 registers per thread plan the forward and the backward's dQ (d <= 128)
    and dK/dV (d <= 128) with their tiles in registers; the 8-wide engines of DG2 and Arrow
    Lake-H (128 registers of 32 bytes) the forward, past d = 64 with two sub-groups per query
    rows, each holding half of O^T (a whole one fills their registers at 128), and the
    backward's dQ and dK/dV up to d = 128 (two sub-groups per rows or keys at d = 64, four at
    128, each with a share of the resident accumulators); so do the emulated shapes of each
    (emulate: sub-group 16, emulate8: DG2's)."""
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
            # With softcap, ALiBi and a mask (FEATURE_* 1 | 2 | 4) too, on the 8-wide engines
            # in shares of O^T of at most 40 rows (two at d = 64, four at 128).
            scored = C.plan("forward", profile, dtype, head_dim, 7, 1, "1")["variant"]
            assert scored.matrix_registers
            assert scored.value_split == (1 if wide else head_dim // 32)
            backward = C.plan("backward", profile, dtype, head_dim, 0, 1, "1")
            dq_registers = True
            assert backward["variant"].matrix_registers == dq_registers
            assert backward["variant"].dkdv_registers == dq_registers
            assert any("flash_bwd_dq_matrix_registers_kernel" in k
                       for k in backward["kernels"]) == dq_registers
            # dK/dV, dQ: one sub-group per keys or rows where 256 registers hold the shares,
            # on the 8-wide engines two at d = 64 and four at 128.
            if dq_registers:
                shares = "1" if wide else str(head_dim // 32)
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
        assert C.plan("backward", "", "bfloat16", 128, 0, 1, mode)["variant"].matrix_registers


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
    kernel); softcap alone splits as no score change does, softcap beside either as they do
    but beside a float mask past d = 64 (the SLM-staged kernel). Both masks, ALiBi and softcap
    against float64 (every change together: test_register_forward_score_forms.py)."""
    from ipex_flash.reference import flash_attn_reference
    matrix_mode("emulate8")
    shares = {40: 2, 64: 2, 80: 2, 96: 3, 128: 4}[head_dim]
    for features, registers in ((2, True), (4, True), (8, True), (2 | 4, True), (1 | 2, True),
                                (1 | 4, True), (1 | 8, head_dim <= 64)):
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
