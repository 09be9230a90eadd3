#!/usr/bin/env bash
# Installs what the build and tests need on a fresh Debian machine. Idempotent:
# each step is skipped when already satisfied.
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v cargo >/dev/null || { echo "cargo (Rust) is required: install rustup first"; exit 1; }
command -v python3 >/dev/null || need_apt+=(python3 python3-venv)
command -v curl >/dev/null || need_apt+=(curl)
command -v redis-server >/dev/null || need_apt+=(redis-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "apt-get install ${need_apt[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import grpc_tools, xxhash, pytest, crc32c' 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r python/requirements-dev.txt
fi
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt
