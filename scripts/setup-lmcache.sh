#!/usr/bin/env bash
# Installs LMCache into its own venv, .tools/lmcache (about 6 GB: it pulls a
# CUDA build of torch that also imports on CPU), with the kvtier SDK installed
# editable, for the LMCache storage-plugin tests (python/tests/lmcache/).
#
# Separate from .tools/vllm because LMCache pins numpy<=2.2.6 and protobuf<7,
# which conflict with vLLM's CPU build (../shared/ENGINES.md). On CPU only
# LMCache's mock GPU connector runs, which is what the tests use.
#
# Idempotent: a venv that already imports the pinned version is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
LMCACHE_VERSION="${LMCACHE_VERSION:-0.5.6}"
VENV=.tools/lmcache
PY="$VENV/bin/python"
want="lmcache=$LMCACHE_VERSION"
if [ -x "$PY" ] && [ "$(cat "$VENV/.kvtier-stamp" 2>/dev/null)" = "$want" ] \
   && "$PY" -c 'import lmcache, kvtier' >/dev/null 2>&1; then
  exit 0
fi
echo "installing LMCache $LMCACHE_VERSION into $VENV (a few minutes, ~6 GB)"
rm -rf "$VENV"
python3 -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "lmcache==$LMCACHE_VERSION"
"${PIP[@]}" -e python crc32c pytest
"$PY" -c 'import lmcache, kvtier' >/dev/null
echo "$want" > "$VENV/.kvtier-stamp"
