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
.venv/bin/pip install --quiet --disable-pip-version-check ".[cpu,test,transformers]"
bash scripts/setup/install_ocloc.sh .venv/ocloc
