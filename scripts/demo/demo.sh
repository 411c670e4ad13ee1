#!/usr/bin/env bash
# Sets up ./.venv and runs the demo: attention on the default device (an XPU where torch has
# one, else the CPU, whose tensors run on the SYCL CPU device; it prints which), its error
# against torch SDPA and its speed next to SDPA's.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup/setup_env.sh
cd /tmp && "$OLDPWD/.venv/bin/python" -m ipex_flash demo "$@"
