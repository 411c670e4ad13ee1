#!/usr/bin/env bash
# The lower end of the SYCL runtime range pyproject.toml accepts: intel-sycl-rt 2026.0.0, the
# family torch 2.13.0+xpu pins. Builds ipex_flash against it in ./.venv-floor, checks the import
# and the SYCL CPU device, runs gpu-check of one GPU's XMX forward (its SPIR-V then comes from
# 2026.0.0's kernel compiler), the forward's kernel forms, the error tests, and the transformers
# backend's tests on the oldest transformers it supports. (scripts/test/test.sh tests the upper
# end, 2026.1.2, in full, with the newest transformers.)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
[ -x .venv-floor/bin/python ] || "$PYTHON" -m venv .venv-floor
floor=$(mktemp)
trap 'rm -f "$floor"' EXIT
printf '%s\n' intel-sycl-rt==2026.0.0 intel-cmplr-lib-ur==2026.0.0 intel-cmplr-lib-rt==2026.0.0 \
  intel-cmplr-lic-rt==2026.0.0 intel-opencl-rt==2026.0.0 >"$floor"
# PIP_CONSTRAINT (not -c) also reaches pip's isolated build environment, so the module is
# compiled against 2026.0.0's headers too; it replaces a machine-wide constraints file, so that
# one is kept in the list.
constraints="$floor"
[ -f /etc/xdg/pip/constraints.txt ] && constraints="/etc/xdg/pip/constraints.txt $floor"
.venv-floor/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
PIP_CONSTRAINT="$constraints" .venv-floor/bin/pip install --quiet --disable-pip-version-check ".[cpu,test]"
# The oldest transformers the backend's continuous batching supports (the main suite has the
# newest): its "paged|" names and per-layer-type lengths. psutil: that release sizes continuous
# batching's cache from the host's free memory, which it reads with psutil on the CPU.
.venv-floor/bin/pip install --quiet --disable-pip-version-check transformers==5.16.0 psutil
.venv-floor/bin/python -c "import importlib.metadata as m; v = m.version('intel-sycl-rt'); \
assert v == '2026.0.0', v; print('intel-sycl-rt', v)"
bash scripts/setup/install_ocloc.sh .venv-floor/ocloc
cd tests
../.venv-floor/bin/python -m ipex_flash info
# The XMX forward: the kernel that asks most of the kernel compiler (the rest of the grid is
# checked against the upper end in the main suite).
../.venv-floor/bin/python -m ipex_flash gpu-check --targets bmg --families forward \
  --dtypes bfloat16
# One worker per core, the tests spread over both: their first builds are most of the time, so
# the forward is checked at one head dim per kernel form (every dtype, both masks, GQA; the
# vector, emulated 16- and 8-wide matrix and decode kernels); the main suite has the grids.
../.venv-floor/bin/python -m pytest -c ../pyproject.toml --rootdir .. -q -n auto \
  forward/test_forward.py::test_grouped_query_heads \
  forward/test_forward.py::test_op_matches_torch_sdpa \
  forward/test_forward.py::test_bfloat16_outputs_round_like_torch \
  api/test_errors.py serving/test_transformers_backend.py \
  serving/test_transformers_continuous_batching.py "$@"
