"""The variant choice explains itself (sycl_src/host/variants/skip_reasons.hpp): C.plan's
"reasons" give, for each faster form a policy passed over (the matrix engine, its register
forms, the decode kernel's matrix scores), one sentence, written out here from the inputs and
the policy's rules, not read back from its output; python -m ipex_flash plan
(ipex_flash/tools/plan.py) prints the kernel a call gets and those reasons; the run-time
fallbacks (build guard, tile-layout probe) warn with the same sentence they add."""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ipex_flash._runtime import C
from ipex_flash.tools import plan

TESTS = Path(__file__).resolve().parent.parent

SOFTCAP, ALIBI, MASK_BOOL, MASK_F32, KV_E4M3, VALUE_DIM = 1, 2, 4, 8, 64, 256  # FEATURE_* bits
# (common/features.hpp)
ON_8_WIDE = "on 8-wide matrix engines the register "

# (family, profile, dtype, head dim, features, rows, mode, head_dim_v) -> the reasons, in order.
KNOWN_REASONS = [
    # Nothing passed over: the register forms on the 256-register XMX GPUs.
    (("forward", "bmg", "bfloat16", 128, 0, 1, "auto", 0), []),
    (("backward", "pvc", "float16", 64, 0, 1, "auto", 0), []),
    (("decode", "lnl", "bfloat16", 128, 0, 4, "auto", 0), []),
    # The matrix engine.
    (("forward", "bmg", "float32", 128, 0, 1, "auto", 0),
     ["float32 input: the matrix engine takes 16-bit inputs"]),
    (("backward", "bmg", "float32", 64, 0, 1, "1", 0),
     ["float32 input: the matrix engine takes 16-bit inputs"]),
    (("forward", "bmg", "bfloat16", 64, 0, 1, "0", 0),
     ["IPEX_FLASH_MATRIX=0 turns the matrix engine off"]),
    (("forward", "mtl", "bfloat16", 64, 0, 1, "auto", 0), ["mtl has no matrix engine"]),
    (("decode", "mtl", "float16", 64, 0, 1, "1", 0), ["mtl has no matrix engine"]),
    (("forward", "dg2", "bfloat16", 128, KV_E4M3, 1, "auto", 0),
     ["FP8 K/V cache on dg2, whose decodes take this kernel: the matrix form's K/V pack would "
      "rewrite the cache at twice its size per step"]),
    # The register forms: head dims.
    (("forward", "bmg", "bfloat16", 256, 0, 1, "auto", 0),
     ["head dim 256 > 128: the register forward takes head dims up to 128"]),
    (("forward", "bmg", "bfloat16", 150, 0, 1, "auto", 0),  # (compiled at 160)
     ["head dim 160 > 128: the register forward takes head dims up to 128"]),
    (("backward", "pvc", "bfloat16", 192, 0, 1, "auto", 0),
     ["head dim 192 > 128: the register backward (dQ, dK/dV) takes head dims up to 128"]),
    (("backward", "dg2", "bfloat16", 96, 0, 1, "auto", 0), []),  # (three sub-groups a block)
    (("backward", "dg2", "bfloat16", 160, 0, 1, "auto", 0),
     ["head dim 160 > 128: " + ON_8_WIDE + "backward (dQ, dK/dV) takes head dims up to 128"]),
    (("forward", "arl-h", "float16", 192, 0, 1, "auto", 0),
     ["value head dim 192 > 128: " + ON_8_WIDE + "forward takes head dims up to 128"]),
    # MLA's head dims: what must fit is v's (128) on the 16-wide engines, and on the 8-wide ones.
    (("forward", "bmg", "bfloat16", 192, 0, 1, "auto", 128), []),
    (("forward", "dg2", "bfloat16", 128, 0, 1, "auto", 192),
     ["value head dim 192 > 128: " + ON_8_WIDE + "forward takes head dims up to 128"]),
    # The register forms: score options on the 8-wide engines.
    (("forward", "dg2", "bfloat16", 64, SOFTCAP | ALIBI, 1, "auto", 0), []),  # fused tanh
    (("forward", "dg2", "bfloat16", 128, SOFTCAP | MASK_F32, 1, "auto", 0),
     ["softcap with a float mask at head dim 128 > 64: " + ON_8_WIDE + "forward keeps one loop "
      "with sycl::tanh there, and would spill the 128 registers beside ALiBi (docs/gpus.md)"]),
    (("forward", "dg2", "bfloat16", 64, SOFTCAP | MASK_F32, 1, "auto", 0), []),
    (("forward", "dg2", "bfloat16", 112, MASK_BOOL, 1, "auto", 0),
     ["ALiBi or a mask at value head dim 112: " + ON_8_WIDE + "forward needs O split into 2-4 "
      "whole-tile shares of 16-40 columns"]),
    (("forward", "dg2", "bfloat16", 64, SOFTCAP, 1, "auto", 0), []),  # (softcap alone: kept)
    (("backward", "dg2", "bfloat16", 64, SOFTCAP | MASK_BOOL, 1, "auto", 0), []),
    (("backward", "dg2", "bfloat16", 128, SOFTCAP | ALIBI | MASK_BOOL, 1, "auto", 0), []),
    (("backward", "dg2", "bfloat16", 64, SOFTCAP | MASK_F32, 1, "auto", 0), []),
    (("backward", "dg2", "bfloat16", 128, SOFTCAP | MASK_F32, 1, "auto", 0),
     ["softcap with a float mask at head dim 128 > 64: " + ON_8_WIDE + "dK/dV keeps one loop "
      "there and would spill in it (docs/gpus.md); dK/dV staged through SLM, dQ in registers"]),
    # The decode kernel's matrix scores.
    (("decode", "dg2", "bfloat16", 128, 0, 4, "auto", 0),
     ["8-wide matrix engine: the decode kernel's matrix scores need tiles 16 wide, its "
      "sub-group's width"]),
    (("decode", "bmg", "bfloat16", 128, KV_E4M3, 4, "auto", 0), []),  # FP8: the register form
    (("decode", "bmg", "bfloat16", 128, KV_E4M3, 16, "auto", 0),
     ["decode kernel's register form: FP8 cache with 16 rows per K/V head: the 16-row form "
      "spills 1-14 KB beside the conversions (gpu-check; 8 rows do not)",
      "FP8 cache: the decode kernel's vector form computes FP8 scores on the vector units"]),
    (("decode", "bmg", "bfloat16", 72, KV_E4M3, 4, "auto", 0),
     ["decode kernel's register form: head dim 72 is not a multiple of 16",
      "FP8 cache: the decode kernel's vector form computes FP8 scores on the vector units"]),
    (("decode", "pvc", "float32", 64, 0, 1, "auto", 0),
     ["float32 input: the matrix engine takes 16-bit inputs"]),
    # The decode kernel's register form (decode/xmx_kernel.hpp).
    (("decode", "bmg", "bfloat16", 256, 0, 16, "auto", 0), []),  # (four sub-groups)
    (("decode", "lnl", "bfloat16", 576, VALUE_DIM, 16, "auto", 512), []),  # MLA (eight)
    (("decode", "bmg", "bfloat16", 160, VALUE_DIM, 4, "auto", 160),
     ["decode kernel's register form: value head dim 160 not in [16, 144] (V's head dim past "
      "Q's takes the vector form)"]),
    (("decode", "lnl", "float16", 128, SOFTCAP | ALIBI | MASK_BOOL, 4, "auto", 0), []),
    (("decode", "pvc", "bfloat16", 128, SOFTCAP, 8, "auto", 0), []),
]


@pytest.mark.parametrize("args,reasons", KNOWN_REASONS, ids=lambda x: "-".join(map(str, x))
                         if isinstance(x, tuple) else None)
def test_each_reason_from_known_inputs(args, reasons):
    assert C.plan(*args)["reasons"] == reasons


@pytest.mark.parametrize("profile", C.profile_names())
def test_a_variant_explains_itself_exactly_when_it_is_not_the_fastest_form(profile):
    """The register forms (the decode's too) give no reason; every vector or SLM-staged variant,
    the backward with only its dQ in registers, and the decode kernel with only its scores on the
    matrix engine give at least one. (Problems no kernel of the device serves raise instead: the
    float32 backward past d = 128 on 64 KiB of local memory.)"""
    fastest = {"forward": lambda v: v.matrix_registers,
               "backward": lambda v: v.matrix_registers and v.dkdv_registers,
               "decode": lambda v: v.matrix_registers}
    for dtype in ("float32", "bfloat16"):
        for head_dim in (32, 64, 96, 128, 192, 256):
            for features in (0, SOFTCAP, ALIBI, SOFTCAP | MASK_BOOL):
                for family, is_fastest in fastest.items():
                    try:
                        chosen = C.plan(family, profile, dtype, head_dim, features, 4)
                    except RuntimeError as error:
                        assert "local memory" in str(error)
                        continue
                    assert (chosen["reasons"] == []) == is_fastest(chosen["variant"]), \
                        (family, dtype, head_dim, features, chosen["reasons"])


def test_the_decode_or_general_choice_says_why():
    """Past 16 query rows per K/V head the decode kernel's row slices serve up to 16 new tokens,
    32 with one or two K/V heads; beyond, the general kernel."""
    assert C.decode_serves_rows(16, 1, 8) == (True, [])
    assert C.decode_serves_rows(128, 16, 8) == (True, [])
    assert C.decode_serves_rows(64, 32, 2) == (True, [])
    served, reasons = C.decode_serves_rows(160, 20, 4)
    assert not served and reasons == [
        "160 query rows per K/V head (more than 16) with 20 new tokens (more than 16 with 4 K/V "
        "heads): the general forward kernel serves it, not the decode kernel's row slices"]


def cli_args(**given):
    args = dict(target="bmg", direction="forward", dtype="bfloat16", head_dim=128, head_dim_v=0,
                causal=False, softcap=False, alibi=False, mask=None, gqa=1, kv_heads=8,
                new_tokens=1, kv_dtype="same", matrix=None, json=False)
    args.update(given)
    return argparse.Namespace(**args)


def printed(capsys, **given):
    assert plan.main(cli_args(**given)) == 0
    return capsys.readouterr().out


def test_cli_names_the_register_kernel_for_bf16_on_bmg(capsys, monkeypatch):
    monkeypatch.delenv("IPEX_FLASH_MATRIX", raising=False)
    out = printed(capsys)
    assert "on: the bmg profile (IPEX_FLASH_MATRIX=auto)" in out
    assert "kernel: general forward kernel on the matrix engine (8x16x16 tiles), tiles in " \
           "registers" in out
    assert "program: programs/flash_fwd_matrix_registers.hpp" in out
    assert "ipex_flash::flash_fwd_matrix_registers_kernel<ipex_flash::bfloat16_bits, 128," in out
    assert "faster forms skipped: none" in out


def test_cli_says_why_float32_runs_on_the_vector_units(capsys):
    out = printed(capsys, dtype="float32", matrix="auto")
    assert "kernel: general forward kernel on the vector units" in out
    assert "program: programs/flash_fwd.hpp" in out
    assert "  - float32 input: the matrix engine takes 16-bit inputs" in out


def test_cli_options_reach_the_policy(capsys):
    """--softcap --mask float32 at d = 128 on DG2's 8-wide engine: dQ in registers, the
    SLM-staged dK/dV, and why; a decode step past what the row slices serve: the general
    kernel, and why."""
    out = printed(capsys, target="dg2", direction="backward", head_dim=128, softcap=True,
                  mask="float32", matrix="auto")
    assert "dQ tiles in registers, dK/dV tiles staged through local memory" in out
    assert "program: programs/flash_bwd_dq_registers.hpp" in out
    assert "  - softcap with a float mask at head dim 128 > 64: " + ON_8_WIDE + "dK/dV keeps" in out
    out = printed(capsys, direction="decode", gqa=8, new_tokens=20, kv_heads=4, matrix="auto")
    assert "kernel: general forward kernel" in out and "programs/flash_fwd_matrix_registers" in out
    assert "  - 160 query rows per K/V head (more than 16) with 20 new tokens" in out
    out = printed(capsys, direction="decode", gqa=4, matrix="auto")
    assert "kernel: split-KV decode kernel, register form (8x16x16 tiles" in out
    assert "program: programs/flash_decode.hpp" in out


def test_cli_plans_mla_decode_on_the_register_form(capsys):
    """v's head dim reaches the decode plan: MLA's 576/512 over one latent cache takes the
    register form's eight sub-groups on BMG, the kernel a call on BMG would build."""
    out = printed(capsys, direction="decode", head_dim=576, head_dim_v=512, gqa=16, kv_heads=1,
                  matrix="auto")
    assert "register form (8x16x16 tiles: Q.K^T and P.V on the matrix engine, 8 sub-groups)" \
           in out
    assert "flash_decode_xmx_kernel<ipex_flash::bfloat16_bits, 576, 16, 256, 256, 8, 16, 16, " \
           "512, 8>" in out


def run_cli(*args, **env):
    # (LD_LIBRARY_PATH: the build guard's child loads the module by its path, which from the
    # source tree is a link whose $ORIGIN does not lead to libsycl)
    environment = dict(os.environ, LD_LIBRARY_PATH=str(Path(sys.prefix) / "lib"), **env)
    done = subprocess.run([sys.executable, "-m", "ipex_flash", "plan", *args], cwd=TESTS,
                          env=environment, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


def test_python_m_ipex_flash_plan_runs():
    out, _ = run_cli("--target", "pvc", "--dtype", "float16", "--head-dim", "256",
                     "--matrix", "auto")
    assert "kernel: general forward kernel on the matrix engine" in out
    assert "tiles staged through local memory" in out
    assert "  - head dim 256 > 128: the register forward takes head dims up to 128" in out


def test_build_guard_fallback_gives_the_reason_its_warning_gives(tmp_path):
    """The SLM-staged emulated forward at d = 256, whose build crashes in the guard's child (the
    seam IPEX_FLASH_TEST_CRASH_BUILD): the machine's device plans the vector kernel, and the
    reason it prints is the one the warning names."""
    out, err = run_cli("--target", "cpu", "--matrix", "emulate8", "--head-dim", "256",
                       IPEX_FLASH_CACHE_DIR=str(tmp_path),  # (the guard's verdicts: kept apart)
                       IPEX_FLASH_BUILD_GUARD="all",
                       IPEX_FLASH_TEST_CRASH_BUILD="flash_fwd_matrix_kernel")
    reason = "the device's compiler cannot build the matrix program (build guard)"
    assert "kernel: general forward kernel on the vector units" in out
    assert f"  - {reason}\n" in out
    warning = [line for line in err.splitlines() if "RuntimeWarning" in line]
    assert len(warning) == 1 and reason in warning[0] and "vector kernels" in warning[0], err


def test_layout_probe_fallback_gives_the_reason_its_warning_gives():
    """Where the engine fails the tile-layout check (the seam IPEX_FLASH_TEST_LAYOUT_MISMATCH
    makes the probe expect another layout), the register forward's call plans the SLM-staged
    kernel, with the reason the warning gives."""
    out, err = run_cli("--target", "cpu", "--matrix", "emulate", "--head-dim", "64",
                       IPEX_FLASH_TEST_LAYOUT_MISMATCH="1")
    reason = "the matrix engine failed the tile-layout check the register forms rely on"
    assert "tiles staged through local memory" in out
    assert f"  - {reason}\n" in out
    warning = [line for line in err.splitlines() if "RuntimeWarning" in line]
    assert len(warning) == 1 and reason in warning[0], err


def test_cli_kv_dtype_reaches_the_decode_choice(capsys, monkeypatch):
    """--kv-dtype: an FP8 decode of 8 rows takes the register form on BMG, 16 rows the vector
    form, and on DG2 (128 registers) the general kernel, each with its reason; FP8 with a
    float32 q or a backward is refused with a message, not a traceback."""
    monkeypatch.delenv("IPEX_FLASH_MATRIX", raising=False)
    out = printed(capsys, direction="decode", gqa=8, kv_dtype="float8_e4m3fn")
    assert "float8_e4m3fn cache" in out and "register form" in out
    assert "faster forms skipped: none" in out
    out = printed(capsys, direction="decode", gqa=16, kv_dtype="float8_e5m2")
    assert "vector scores" in out and "FP8 cache with 16 rows per K/V head" in out
    out = printed(capsys, target="dg2", direction="decode", gqa=8, kv_dtype="float8_e5m2")
    assert "kernel: general forward kernel" in out
    assert "  - FP8 cache on dg2: its decode kernel's conversions spilled" in out
    for given in (dict(dtype="float32"), dict(direction="backward")):
        assert plan.main(cli_args(kv_dtype="float8_e4m3fn", **given)) == 2
        assert "error: --kv-dtype float8_e4m3fn: FP8 caches take float16 or bfloat16" in \
            capsys.readouterr().err
