#!/usr/bin/env bash
# Installs what the build (and, with --test, the test suite) needs on a fresh
# Debian machine. Idempotent: each step is skipped when already satisfied.
#   scripts/setup.sh          what `make demo` needs (Rust, Python venv, curl)
#   scripts/setup.sh --test   plus redis-server, chromium, Azurite, MinIO and promtool for `make test`
set -euo pipefail
cd "$(dirname "$0")/.."
for_tests=false
# The versions CI tested (notes/044); MinIO publishes no Go module tags, so
# this is the pseudo-version `go install ...@latest` resolved to then.
AZURITE_VERSION="${AZURITE_VERSION:-3.35.0}"
MINIO_VERSION="${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
[ "${1:-}" = "--test" ] && for_tests=true
need_apt=()
# version_ge A B: A >= B for dotted versions.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
command -v cargo >/dev/null || { echo "Rust is required (>= 1.89): install it with rustup (https://rustup.rs); Debian's rustc is too old"; exit 1; }
rust_v=$(rustc --version | awk '{print $2}')
version_ge "$rust_v" 1.89 || { echo "Rust $rust_v is too old: kvtier needs >= 1.89 (rustup update)"; exit 1; }
command -v python3 >/dev/null || need_apt+=(python3 python3-venv)
command -v curl >/dev/null || need_apt+=(curl)
command -v ss >/dev/null || need_apt+=(iproute2)
command -v cc >/dev/null || need_apt+=(gcc libc6-dev)
if $for_tests; then
  command -v redis-server >/dev/null || need_apt+=(redis-server)
  command -v redis-benchmark >/dev/null || need_apt+=(redis-tools)
  command -v chromium >/dev/null || need_apt+=(chromium)
  command -v systemd-analyze >/dev/null || need_apt+=(systemd)
  # libfuse 3 and fusermount3 for the power-cut file system (python/tests/powercut)
  command -v fusermount3 >/dev/null || need_apt+=(fuse3)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "apt-get install ${need_apt[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import grpc_tools, xxhash, pytest, crc32c, yaml, kubernetes_validate, packaging, mypy' 2>/dev/null \
   || ! .venv/bin/python -c 'import importlib.util as u, sys; sys.exit(u.find_spec("mfusepy") is None)' 2>/dev/null \
   || [ "$(.venv/bin/ruff --version 2>/dev/null)" != "ruff 0.17.5" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check --no-cache-dir -r python/requirements-dev.txt
fi
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt
$for_tests || exit 0
# Object-store emulators for the object-store tier's tests (crates/kvtier-server/tests/object_store.rs,
# crates/kvtier-object/tests): Azurite (npm) and MinIO (Go), under .tools/.
if [ ! -f .tools/azurite/node_modules/azurite/dist/src/blob/main.js ]; then
  if ! command -v npm >/dev/null; then
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
  fi
  echo "npm install azurite@$AZURITE_VERSION -> .tools/azurite"
  npm install --silent --no-audit --no-fund --prefix .tools/azurite "azurite@$AZURITE_VERSION" >/dev/null
fi
if [ ! -x .tools/bin/minio ] && ! command -v minio >/dev/null && [ ! -x "${HOME:-/root}/go/bin/minio" ]; then
  command -v go >/dev/null || { echo "Go >= 1.24 is required to build MinIO for the object-store tests: install it from https://go.dev/dl (Debian's golang-go is 1.19, too old)"; exit 1; }
  go_v=$(go env GOVERSION | sed 's/^go//')
  version_ge "$go_v" 1.24 || { echo "Go $go_v is too old to build MinIO: install Go >= 1.24 from https://go.dev/dl"; exit 1; }
  echo "go install github.com/minio/minio@$MINIO_VERSION -> .tools/bin (about 2 minutes)"
  # Modules and build cache in a temp dir, deleted after: ~/go and ~/.cache/go-build
  # would keep about 2 GB the binary never needs (-modcacherw lets rm delete them).
  gotmp=$(mktemp -d)
  GOBIN="$PWD/.tools/bin" GOMODCACHE="$gotmp/mod" GOCACHE="$gotmp/cache" GOFLAGS="${GOFLAGS:+$GOFLAGS }-modcacherw" \
    go install "github.com/minio/minio@$MINIO_VERSION"
  rm -rf "$gotmp"
fi
# promtool for the alert rules' checks (python/tests/test_alerts.py), taken out of
# Debian's prometheus package into .tools/bin: installing the package would also
# start a Prometheus server and pull in node-exporter. The version tested is
# Debian 12's; when Debian replaces it with a fix release, its candidate is taken.
PROMETHEUS_DEB_VERSION="${PROMETHEUS_DEB_VERSION:-2.42.0+ds-5+deb12u1}"
if ! .tools/bin/promtool --version 2>/dev/null | grep -q '^promtool, version 2\.'; then
  echo "promtool (Debian's prometheus $PROMETHEUS_DEB_VERSION) -> .tools/bin"
  tmp=$(mktemp -d)
  if [ -z "$(apt-cache policy prometheus 2>/dev/null | grep Candidate: | grep -v none)" ]; then
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
  fi
  (cd "$tmp" && { apt-get download -qq "prometheus=$PROMETHEUS_DEB_VERSION" 2>/dev/null || apt-get download -qq prometheus; } >/dev/null)
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/pkg"
  mkdir -p .tools/bin && cp "$tmp/pkg/usr/bin/promtool" .tools/bin/promtool
  rm -rf "$tmp"
  v=$(.tools/bin/promtool --version | awk 'NR==1 {print $3}')
  version_ge "${v%%+*}" 2.42 || { echo "promtool $v is too old: the alert tests need >= 2.42"; exit 1; }
fi
# Mooncake Store, the bench's second peer (crates/kvtier/tests/bench.rs runs it), in .tools/mooncake (~180 MB).
scripts/setup-mooncake.sh
