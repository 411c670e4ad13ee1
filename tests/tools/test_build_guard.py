"""A device compiler that crashes on a matrix program costs that program, not the process
(build_guard.hpp): each new matrix program is built first in a child process, and a program
whose build failed or crashed there runs on the vector kernels, with one warning naming it.

Each case runs in a process of its own (the guard's verdicts live for a process and in a
directory of verdicts), with the SYCL kernel cache of this one so nothing is recompiled."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ipex_flash  # noqa: F401  (sets SYCL_CACHE_DIR, which the children share)

TESTS = Path(__file__).resolve().parent.parent  # tests/: the children import helpers

# The bf16 SDPA backward with a float attn_mask and GQA (test_sdpa's check against the float64
# reference, helpers.sdpa), with the warnings it raised, as JSON on the last line of stdout.
MASKED_BACKWARD = """
import json, warnings
import ipex_flash, torch
from helpers.sdpa import check_masked_gradients
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    check_masked_gradients(torch.bfloat16, "float32", True)
print(json.dumps([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]))
"""

# The forward's and the backward's scratch for a bf16 problem without and with an attn_mask,
# and the warnings the guard raised: scratch is sized for the matrix kernels' packed copies
# when they are used, 0 for the vector kernels.
MATRIX_PLANS_FOR_AMX = """
import json, warnings
import ipex_flash, torch
from ipex_flash._runtime import C
from ipex_flash.ops.launch import view
C.set_cpu_matrix_engine(True)
q = torch.randn(3, 3, 70, 64, dtype=torch.bfloat16)
k = torch.randn(3, 1, 70, 64, dtype=torch.bfloat16)
result = {}
for name, mask in (("none", None), ("bool", torch.rand(3, 1, 70, 70) > 0.5),
                   ("float", torch.randn(3, 1, 70, 70))):
    options = C.AttentionOptions()
    if mask is not None:
        options.attn_mask = view(mask)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forward = C.fwd_scratch_bytes(view(q), view(k), view(k), options, 0)
        backward = C.bwd_scratch_bytes(view(q), view(k), view(k), options, 0)
    result[name] = [forward, backward, [str(w.message) for w in caught]]
print(json.dumps(result))
"""


def run_child(script, tmp_path, **env):
    environment = dict(os.environ, IPEX_FLASH_CACHE_DIR=str(tmp_path), **env)
    done = subprocess.run([sys.executable, "-c", script], cwd=TESTS, env=environment,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def verdicts(tmp_path, suffix):
    return sorted((tmp_path / "build-verdicts").glob(f"*.{suffix}"))


def test_crashing_build_runs_the_vector_kernels(tmp_path):
    """The matrix backward's build (its dK/dV kernel) dies of SIGSEGV in the child (the test seam
    IPEX_FLASH_TEST_CRASH_BUILD, as the CPU compiler's AMX lowering did): the caller lives,
    its backward runs on the vector kernels and matches the reference, and one warning names
    the program. A second process reads the verdict instead of building again."""
    env = dict(IPEX_FLASH_MATRIX="emulate", IPEX_FLASH_BUILD_GUARD="all",
               IPEX_FLASH_TEST_CRASH_BUILD="flash_bwd_dkdv_matrix")
    first = run_child(MASKED_BACKWARD, tmp_path, **env)
    rejected = [m for m in first if "flash_bwd_dkdv_matrix" in m]
    assert len(rejected) == 1, first
    assert "crashed" in rejected[0] and "vector kernels" in rejected[0], rejected
    failed = verdicts(tmp_path, "failed")
    assert len(failed) == 1
    assert verdicts(tmp_path, "ok"), "the forward's matrix program built in its child"
    stamp = failed[0].stat().st_mtime_ns

    second = run_child(MASKED_BACKWARD, tmp_path, **env)
    assert [m for m in second if "flash_bwd_dkdv_matrix" in m and "kept in" in m], second
    assert failed[0].stat().st_mtime_ns == stamp


def test_programs_that_build_run_unwarned(tmp_path):
    """With the guard on every matrix program, programs that build are used as before: no
    warning, and their verdicts are kept."""
    found = run_child(MASKED_BACKWARD, tmp_path, IPEX_FLASH_MATRIX="emulate",
                      IPEX_FLASH_BUILD_GUARD="all")
    assert found == []
    assert verdicts(tmp_path, "ok") and not verdicts(tmp_path, "failed")


def test_matrix_programs_for_amx_build_or_are_not_chosen(tmp_path):
    """Built for Sapphire Rapids' AMX (the target the package names on AMX Xeons; any x86 CPU
    device compiles for it, only an AMX Xeon runs it), in the guard's child processes: the bf16
    matrix forward with and without a mask and the unmasked matrix backward build (no warning,
    matrix scratch); the masked backward, whose build crashed that compiler, plans the vector
    kernels (scratch 0) without trying."""
    sycl_cache = tmp_path / "sycl-sapphirerapids"  # binaries for a target this CPU may lack
    plans = run_child(MATRIX_PLANS_FOR_AMX, tmp_path, IPEX_FLASH_MATRIX="16",
                      CL_CONFIG_CPU_TARGET_ARCH="sapphirerapids", SYCL_CACHE_DIR=str(sycl_cache))
    for mask, (forward, backward, warned) in plans.items():
        assert warned == [], (mask, warned)
        assert forward > 0, mask
        assert (backward > 0) == (mask == "none"), (mask, backward)
    assert len(verdicts(tmp_path, "ok")) == 4  # three forward programs, one backward


def test_unknown_guard_setting_is_refused(monkeypatch):
    import torch
    monkeypatch.setenv("IPEX_FLASH_MATRIX", "emulate")
    monkeypatch.setenv("IPEX_FLASH_BUILD_GUARD", "sometimes")
    q = torch.randn(1, 2, 20, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="IPEX_FLASH_BUILD_GUARD must be matrix, all or 0"):
        torch.ops.ipex_flash.attention(q, q, q)
