"""The matrix-engine forward kernel (flash_fwd_matrix.hpp: joint_matrix, AMX on this project's
Xeons, XMX on Intel GPUs): its tile shapes forced one by one through IPEX_FLASH_MATRIX, against
the float64 reference and against the vector kernel; its selection rules; and a compile check
that runs on any machine."""
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

from conftest import assert_matches_reference, random_qkv

HAS_MATRIX_ENGINE = C.device_info()["matrix_engine"]
needs_engine = pytest.mark.skipif(
    not HAS_MATRIX_ENGINE,
    reason="the SYCL CPU device of this machine has no matrix engine (AMX bf16 tiles); "
           "test_matrix_kernel_compiles still checks the kernel source")

# Tile shapes (MATRIX_M) the kernel is instantiated with: 16 rows (AMX), 8 rows (XMX on
# Xe-HPC); the reduction step follows from the head dim (32 where it divides it, else 16).
TILE_MODES = ["16", "8"]


@pytest.fixture
def matrix_mode(monkeypatch):
    def set_mode(mode):
        monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    return set_mode


@needs_engine
@pytest.mark.parametrize("len_q,len_k", [(1, 1), (17, 300), (127, 127), (300, 113)])
@pytest.mark.parametrize("head_dim", [16, 40, 64, 80, 128, 200])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", TILE_MODES)
def test_matches_reference(matrix_mode, mode, causal, head_dim, len_q, len_k):
    matrix_mode(mode)
    q, k, v = random_qkv(2, 4, 2, len_q, len_k, head_dim, torch.bfloat16)
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16)


@needs_engine
@pytest.mark.parametrize("mode", TILE_MODES)
def test_selected_and_distinct_from_vector_kernel(matrix_mode, mode):
    """The forced mode really builds the matrix variant, and its output differs from the
    vector kernel's (it rounds P to bfloat16 before P.V) while both match the reference."""
    matrix_mode(mode)
    variant = C.warmup_fwd("bfloat16", 64, 0)
    assert (variant.matrix_m, variant.matrix_k) == (int(mode), 32)
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


@needs_engine
@pytest.mark.parametrize("mode", TILE_MODES)
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


@needs_engine
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_applies_the_reported_mask(matrix_mode, causal):
    from ipex_flash import ops
    from test_dropout import reference_with_mask
    matrix_mode("16")
    p = 0.3
    q, k, v = random_qkv(2, 4, 2, 45, 70, 64, torch.bfloat16)
    seed = ops.draw_dropout_seed(q.device)
    keep = torch.ops.ipex_flash.dropout_mask(seed, [2, 4, 45, 70], p)
    out, _ = torch.ops.ipex_flash.attention_forward(q, k, v, causal, None, p, seed)
    ref = reference_with_mask(q.double(), k.double(), v.double(), keep, p, causal)
    assert_matches_reference(out, None, ref, None, torch.bfloat16)


def test_float32_never_takes_it(matrix_mode):
    matrix_mode("1" if HAS_MATRIX_ENGINE else "0")
    assert C.warmup_fwd("float32", 64, 0).matrix_m == 0


def test_forced_on_float16_runs_or_says_why(matrix_mode):
    """float16 tiles need AMX-FP16 (Granite Rapids) or an Intel GPU. Forced on, the call either
    runs the matrix kernel correctly or raises an error that names the missing engine."""
    matrix_mode("1")
    q, k, v = random_qkv(1, 2, 1, 40, 50, 32, torch.float16)
    try:
        out = ipex_flash.attention(q, k, v)
    except RuntimeError as e:
        assert "IPEX_FLASH_MATRIX=1" in str(e) and "no matrix engine for float16" in str(e)
        return
    ref_out, _ = attention_reference(q, k, v)
    assert_matches_reference(out, None, ref_out, None, torch.float16)


def test_bad_mode_is_rejected(matrix_mode):
    matrix_mode("fast")
    q, k, v = random_qkv(1, 1, 1, 8, 8, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="IPEX_FLASH_MATRIX must be auto, 0, 1, 8 or 16"):
        ipex_flash.attention(q, k, v)


def test_matrix_kernel_compiles():
    """The kernel source goes through the full DPC++ front end for this machine's SYCL CPU
    device, in a child process: where the CPU runtime targets AMX it must build and yield
    the kernel; elsewhere (SYCL_RUNTIME.md: no AMX) the build must pass the front end (a type
    error fails it) even though the bundle then holds no kernel."""
    names = [f"ipex_flash::flash_fwd_matrix_kernel<ipex_flash::bfloat16_bits, {d}, 64, 64, {f}, {m}, {k}>"
             for d, f, m, k in [(64, 0, 16, 32), (80, 3, 8, 16), (128, 1, 8, 16)]]
    script = textwrap.dedent(f"""
        from ipex_flash._runtime import C
        for name in {names!r}:
            try:
                C.build_kernel("flash_fwd_matrix.hpp", name)
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
