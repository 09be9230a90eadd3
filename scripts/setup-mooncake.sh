#!/usr/bin/env bash
# Installs Mooncake Store (CPU build, TCP transport) into its own venv,
# .tools/mooncake, for the Mooncake peer of `kvtier bench`
# (crates/kvtier-bench/src/competitors/mooncake_driver.py runs with .tools/mooncake/bin/python).
#
# The wheel mooncake-transfer-engine-non-cuda ships the Python binding
# (mooncake.store.MooncakeDistributedStore) and the mooncake_master binary.
# Its shared libraries link libibverbs, librdmacm and libnuma even when only
# TCP is used, so those system libraries are installed when missing
# (../shared/ENGINES.md, "Mooncake Store on CPU").
#
# Idempotent: a venv that already imports the pinned version is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
MOONCAKE_VERSION="${MOONCAKE_VERSION:-0.3.13.post1}"
PKG=mooncake-transfer-engine-non-cuda
VENV=.tools/mooncake
PY="$VENV/bin/python"
want="$PKG=$MOONCAKE_VERSION"
check='from mooncake.store import MooncakeDistributedStore'

die() { echo "setup-mooncake: error: $*" >&2; exit 1; }

# System libraries the wheel's .so files need (dlopen fails without them).
need_libs() {
  local missing=()
  for p in libibverbs1 librdmacm1 libnuma1; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
      || missing+=("$p")
  done
  echo "${missing[@]:-}"
}
missing=$(need_libs)
if [ -n "$missing" ]; then
  command -v apt-get >/dev/null || die "missing system packages ($missing) and no apt-get; install them by hand"
  SUDO=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "missing system packages ($missing); run as root or install them: apt-get install $missing"
    SUDO=(sudo)
  fi
  echo "installing system packages: $missing"
  # shellcheck disable=SC2086
  if ! DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends $missing; then
    echo "apt-get install failed; running apt-get update and retrying"
    "${SUDO[@]}" apt-get update -q || die "apt-get update failed"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends $missing \
      || die "apt-get install $missing failed"
  fi
  missing=$(need_libs)
  [ -z "$missing" ] || die "system packages still missing after apt-get: $missing"
fi

if [ -x "$PY" ] && [ "$(cat "$VENV/.kvtier-stamp" 2>/dev/null)" = "$want" ] \
   && "$PY" -c "$check" >/dev/null 2>&1; then
  exit 0
fi

command -v python3 >/dev/null || die "python3 not found"
python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 8) else 1)' \
  || die "python3 >= 3.8 needed, found $(python3 -V 2>&1)"
echo "installing $PKG $MOONCAKE_VERSION into $VENV"
rm -rf "$VENV"
python3 -m venv "$VENV" || die "python3 -m venv failed (is python3-venv installed?)"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir)
"${PIP[@]}" pip==26.3 || die "pip install pip==26.3 failed"
"${PIP[@]}" "$PKG==$MOONCAKE_VERSION" || die "pip install $PKG==$MOONCAKE_VERSION failed"
if ! err=$("$PY" -c "$check" 2>&1); then
  die "the installed package does not import: $err"
fi
master=$(ls "$VENV"/bin/mooncake_master 2>/dev/null || true)
if [ -z "$master" ]; then
  master=$("$PY" - <<'EOF'
import os, mooncake
d = os.path.dirname(mooncake.__file__)
for root, _, files in os.walk(d):
    if "mooncake_master" in files:
        print(os.path.join(root, "mooncake_master")); break
EOF
)
fi
[ -n "$master" ] || die "mooncake_master not found in $VENV"
echo "$want" > "$VENV/.kvtier-stamp"
echo "mooncake ready: $PY, master $master"
