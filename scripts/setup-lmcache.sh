#!/usr/bin/env bash
# Installs LMCache into its own venv, .tools/lmcache, with the kvtier SDK
# installed editable and SGLang's Python package (without its GPU dependencies:
# the tests only import its HiCache storage interface), for the LMCache and
# SGLang backend tests (python/tests/integrations/).
#
# torch is not installed a second time: LMCache accepts any torch, so the venv
# gets .tools/vllm's torch 2.13.0 and its CUDA runtime wheels as hard links
# (scripts/link-dists.py). Installed on its own LMCache pulls the newest torch
# and ~6 GB with it; shared, the venv adds about 1.5 GB, which keeps `make
# test` inside the disk a CI machine has (a CI run ran out of space here).
#
# Separate from .tools/vllm because LMCache pins numpy<=2.2.6 and protobuf<7,
# which conflict with vLLM's CPU build (../shared/ENGINES.md). On CPU only
# LMCache's mock GPU connector runs, which is what the tests use.
#
# Idempotent: a venv that already imports the pinned version is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
LMCACHE_VERSION="${LMCACHE_VERSION:-0.5.6}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
VENV=.tools/lmcache
PY="$VENV/bin/python"
want="lmcache=$LMCACHE_VERSION sglang=$SGLANG_VERSION torch=shared"
check='import lmcache, kvtier; from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory'
if [ -x "$PY" ] && [ "$(cat "$VENV/.kvtier-stamp" 2>/dev/null)" = "$want" ] \
   && "$PY" -c "$check" >/dev/null 2>&1; then
  exit 0
fi
scripts/setup-vllm.sh
echo "installing LMCache $LMCACHE_VERSION into $VENV (a few minutes, ~1.5 GB; torch shared with .tools/vllm)"
rm -rf "$VENV"
python3 -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir)
"${PIP[@]}" pip==26.3
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
torch_v=$(.tools/vllm/bin/python -c 'from importlib.metadata import version; print(version("torch"))')
.tools/vllm/bin/python scripts/link-dists.py .tools/vllm/bin/python "$site" torch
"${PIP[@]}" "lmcache==$LMCACHE_VERSION" "torch==$torch_v"
# Keep LMCache's pins: protobuf<7 and the grpcio it installed (grpcio-tools then
# resolves to a release that accepts both).
grpc_v=$("$PY" -c 'import grpc; print(grpc.__version__)')
"${PIP[@]}" -e python crc32c==2.9.post0 pytest==9.2.0 "protobuf<7" "grpcio==$grpc_v" "grpcio-tools==$grpc_v"
# SGLang's full dependency set is GPU-only; its storage interface imports with these.
"${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
"${PIP[@]}" orjson==3.13.0 pybase64==1.5.1 pillow==13.0.0 ipython==9.18.1
"$PY" -c "$check" >/dev/null
echo "$want" > "$VENV/.kvtier-stamp"
