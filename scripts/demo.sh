#!/usr/bin/env bash
# Sets up ./.venv and runs the demo: attention on the default device (the SYCL CPU device
# here), its error against torch SDPA and its speed next to SDPA's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
cd /tmp && "$OLDPWD/.venv/bin/python" -m ipex_flash demo "$@"
