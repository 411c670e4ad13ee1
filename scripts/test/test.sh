#!/usr/bin/env bash
# Sets up ./.venv and runs the test suite (extra pytest arguments are passed through).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup/setup_env.sh
# vLLM's CPU build in a venv of its own, for the tests that run vLLM's engine on ipex_flash.
bash scripts/setup/setup_vllm_env.sh
# Run from tests/ so the source tree's ipex_flash/ (which has no compiled module) does not
# shadow the installed package.
# One worker per core (pytest-xdist), each test file on one worker: a file's cases share
# kernel variants, which then build once.
cd tests && ../.venv/bin/python -m pytest -c ../pyproject.toml --rootdir .. -n auto \
  --dist loadfile . "$@"
