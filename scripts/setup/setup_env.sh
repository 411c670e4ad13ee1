#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs ipex_flash into it with the test extras, and Intel's
# offline GPU compiler (ocloc) into .venv/ocloc for gpu-check.
# Needs only Python 3.9+ and gcc: torch, the SYCL runtime and its compiler come from PyPI,
# ocloc from Debian's package archive (unpacked into the venv; nothing system-wide changes).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# torch first and pinned, so nothing below resolves a different (e.g. CUDA) build.
.venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
# ipex_flash built once into a wheel, which setup_vllm_env.sh installs into the vLLM venv too.
rm -rf build/wheelhouse
.venv/bin/pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir build/wheelhouse .
wheel=$(ls build/wheelhouse/ipex_flash-*.whl)
.venv/bin/pip install --quiet --disable-pip-version-check "$wheel[cpu,test,transformers]"
# (again, forced: a wheel of the installed version number is otherwise taken as installed)
.venv/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
bash scripts/setup/install_ocloc.sh .venv/ocloc
