"""The matrix-engine modes (IPEX_FLASH_MATRIX): whether this machine's SYCL CPU device has a
matrix engine and for which dtypes, the tile-height modes, the modes the tests run the matrix
kernels in, and the matrix_mode fixture that sets the mode for one test. Shared by the
matrix/test_matrix_*.py files and matrix/test_fp8_matrix.py (which import matrix_mode into
their namespace, as a fixture)."""
import pytest

import ipex_flash  # noqa: F401  (imported before torch, see _runtime.py)
from ipex_flash._runtime import C

HAS_MATRIX_ENGINE = C.device_info()["matrix_engine"]
needs_engine = pytest.mark.skipif(
    not HAS_MATRIX_ENGINE,
    reason="the SYCL CPU device of this machine has no matrix engine (AMX bf16 tiles); "
           "test_matrix_kernel_compiles still checks the kernel source, and the emulate cases "
           "run the kernels with joint_matrix emulated")

# The input dtypes the engine has tiles for: AMX on Sapphire Rapids takes bfloat16 only (FP16
# tiles came with Granite Rapids).
ENGINE_DTYPES = {shape["dtype"] for shape in C.device_limits()["matrix"]}

# Tile shapes (MATRIX_M) the kernel is instantiated with: 16 rows (AMX), 8 rows (XMX on
# Xe-HPC); the reduction step follows from the head dim (32 where it divides it, else 16).
TILE_MODES = ["16", "8"]

# Modes that run the matrix kernels: those tile shapes on the engine (skipped without one), and
# with joint_matrix emulated by sub-group arithmetic (matrix_tile.hpp), which runs anywhere:
# AMX's shape (emulate: N = 16) and DG2 / Arrow Lake-H's XMX shape (emulate8: N = 8 with
# sub-group 8, M = 8, K = 16), so the kernels' packing, tiling, masks and softmax are tested
# on every machine in both widths.
EMULATED = ["emulate", "emulate8"]
RUN_MODES = [pytest.param(mode, marks=needs_engine) for mode in TILE_MODES] + EMULATED
ONE_RUN_MODE = [pytest.param("16", marks=needs_engine), "emulate"]


def skip_without_engine_tiles(mode, dtype):
    """Skips a case that forces the engine's tiles (a tile-height mode) for a dtype it has none
    for: there the mode is an error by design (test_forced_on_float16_runs_or_says_why)."""
    name = str(dtype).removeprefix("torch.")
    if mode in TILE_MODES and name not in ENGINE_DTYPES:
        pytest.skip(f"this CPU's matrix engine has no {name} tiles (AMX before Granite Rapids "
                    "takes bfloat16 only); the emulated modes run the case")


@pytest.fixture
def matrix_mode(monkeypatch):
    def set_mode(mode):
        monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    return set_mode
