#!/usr/bin/env bash
# Installs Intel's offline compiler ocloc (with IGC) into a folder of the project
# (default .venv/ocloc), without changing anything system-wide, so that the kernels'
# SPIR-V can be compiled to native Intel GPU code (register use, spills, dpas) on a
# machine without a GPU. Usage: scripts/setup/install_ocloc.sh [DIR]  (or OCLOC_HOME=DIR).
#
# Why Debian unstable: the ocloc of Debian 12 (22.43) knows no Xe2 (bmg, lnl) and no
# SPV_KHR_cooperative_matrix. Unstable's intel-ocloc needs glibc >= 2.43 and
# libstdc++ 14, so those come from unstable too and ocloc is started through the
# folder's own dynamic loader; the host's libc is never used by it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=${1:-${OCLOC_HOME:-$repo/.venv/ocloc}}
wrapper=$dest/bin/ocloc

# Idempotent: a working wrapper means there is nothing to do.
if [ -x "$wrapper" ] && "$wrapper" --version >/dev/null 2>&1; then
    echo "ocloc already installed in $dest: $("$wrapper" --version)"
    exit 0
fi

pkgs=(intel-ocloc libigc2 libigdfcl2 libigdgmm12
      libc6 libstdc++6 libgcc-s1 zlib1g libzstd1)
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || { echo "missing $keyring (apt-get install debian-archive-keyring)" >&2; exit 1; }

# apt's own state lives in a temporary folder: its sources list (unstable only,
# signatures checked against Debian's keyring), lists, cache, and an empty dpkg
# status, so the system's apt and dpkg state are neither read nor written.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{lists/partial,cache/archives/partial,parts,debs}
: >"$work/status"
echo "deb [signed-by=$keyring] http://deb.debian.org/debian unstable main" >"$work/sources.list"
apt_opts=(
    -o Dir::Etc::sourcelist="$work/sources.list"
    -o Dir::Etc::sourceparts="$work/parts"
    -o Dir::Etc::preferencesparts="$work/parts"
    -o Dir::State::lists="$work/lists"
    -o Dir::State::status="$work/status"
    -o Dir::Cache="$work/cache"
    -o APT::Architecture=amd64 -o APT::Architectures=amd64
    # As root, apt downloads as user _apt, who cannot write into our mktemp folder.
    -o APT::Sandbox::User="$(id -un)"
)
apt-get "${apt_opts[@]}" -q update
(cd "$work/debs" && apt-get "${apt_opts[@]}" -q download "${pkgs[@]}")
echo "downloaded: $(du -sh "$work/debs" | cut -f1)"

# Unpack without installing: every package's files land under $dest (a previous,
# broken install's files are replaced; nothing else in $dest is touched).
rm -rf "$dest/usr" "$dest/etc" "$dest/bin"
mkdir -p "$dest/bin"
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$dest"; done
real=$(cd "$dest/usr/bin" && ls ocloc-* | head -n1)

# The wrapper runs ocloc through the folder's loader. --library-path also covers
# what ocloc dlopens (libocloc, libigc, libigdfcl), and unlike LD_LIBRARY_PATH it is
# not inherited by child processes. Paths are found from the wrapper's own location,
# so the folder can be moved.
cat >"$wrapper" <<EOF
#!/bin/sh
# ocloc from Debian unstable, run with its own glibc (written by scripts/setup/install_ocloc.sh)
d=\$(cd "\$(dirname "\$(readlink -f "\$0")")/.." && pwd)
exec "\$d/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \\
    --library-path "\$d/usr/lib/x86_64-linux-gnu:\$d/lib/x86_64-linux-gnu" \\
    --argv0 ocloc "\$d/usr/bin/$real" "\$@"
EOF
chmod +x "$wrapper"

echo "ocloc installed in $dest ($(du -sh "$dest" | cut -f1)): $("$wrapper" --version)"
