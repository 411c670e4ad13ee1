#!/usr/bin/env bash
# Checks that pip resolves ipex_flash beside the newest SYCL runtime, intel-sycl-rt 2026.2.0
# (Level Zero only: what a GPU machine has once torch XPU pins it), without the CPU extra: the
# install an Intel GPU machine makes. Resolution only (pip's --dry-run), in a fresh venv with
# torch 2.13.0 installed first, as on such a machine; nothing of the runtime is installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0
"$work/venv/bin/pip" install --dry-run --quiet --disable-pip-version-check \
  --report "$work/report.json" "intel-sycl-rt==2026.2.0" .
"$work/venv/bin/python" - "$work/report.json" <<'PY'
import json
import sys

installs = {item["metadata"]["name"].lower(): item["metadata"]["version"]
            for item in json.load(open(sys.argv[1]))["install"]}
runtime = {name: version for name, version in installs.items() if name.startswith("intel-")}
print("resolved beside intel-sycl-rt 2026.2.0:", ", ".join(f"{n} {v}" for n, v in sorted(runtime.items())))
assert installs.get("intel-sycl-rt") == "2026.2.0", installs
assert installs.get("ipex-flash") or installs.get("ipex_flash"), installs
assert "intel-opencl-rt" not in installs, "the CPU runtime belongs to the cpu extra"
PY
