"""The selection rules of the matrix kernels: which variant each IPEX_FLASH_MATRIX mode builds,
with which options and for which dtypes, the error of a mode this machine cannot run and of a
bad mode; and a compile check of the kernels' source that runs on any machine."""
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

from helpers.cases import random_qkv
from helpers.matrix import HAS_MATRIX_ENGINE, matrix_mode  # noqa: F401 (matrix_mode: a fixture)
from helpers.reference import assert_matches_reference


def test_emulated_variants_and_build_options(matrix_mode):
    """emulate picks AMX's tile shape on any device (the decode's register form: XMX's 8x16x16,
    the only one it is built for), marks the variants, and builds them with
    IPEX_FLASH_MATRIX_EMULATE (kept apart from real matrix builds in the kernel caches, whose
    keys include the options); float32 keeps the vector kernels."""
    for family, tile in (("forward", (16, 32)), ("decode", (8, 16))):
        plan = C.plan(family, "", "float16", 128, 0, 4, "emulate")
        variant = plan["variant"]
        assert (variant.matrix_m, variant.matrix_k, variant.matrix_emulated) == (*tile, True)
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
