#!/usr/bin/env bash
# The data-plane comparison (scripts/bench-data-plane.py) on a lent 16-core
# device machine: kvtier serve, redis-server and Mooncake's processes on CPUs
# 0-7, the generators on 8-15. That machine reaches no registry and gets only
# the working tree plus at most 8 carried paths of 64 MiB in all, so:
#
#   scripts/device-data-plane.sh pack        # here: out/device/bundle.tar.xz (the one carried path)
#   scripts/device-data-plane.sh run         # there: unpack, check each tool runs, measure into $OUT
#   scripts/device-data-plane.sh run --dry-run   # print the plan and the time estimate, run nothing
#
# The bundle (docs/bench.md, "On a lent 16-core device"): target/release/kvtier
# stripped; redis-server and redis-benchmark with the shared libraries they
# load that are not glibc's; Mooncake Store's wheel (its package, its bundled
# libraries, its dist-info) with the CPython 3.11 it was built for (the
# binary, libpython, the standard library without tests), since its modules
# import into no other Python. xz-compressed, since the release binary alone
# is 150 MB unstripped. The commit goes along as KVTIER_COMMIT: the device's
# copy of the tree has no .git (perf/header.py).
#
# Settings (environment): DURATION=2s WARMUP=1s C=1,8,32 REPEAT=3
# SERVER_CPUS=0-7 GEN_CPUS=8-15 PEERS=redis,mooncake BUNDLE=out/device/bundle.tar.xz
# WORK=/tmp/kvtier-device (where the bundle is unpacked) LIMIT_S=480 (run
# refuses a plan estimated longer: the device gives 10 minutes a command).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-2s} WARMUP=${WARMUP:-1s} C=${C:-1,8,32} REPEAT=${REPEAT:-3}
SERVER_CPUS=${SERVER_CPUS:-0-7} GEN_CPUS=${GEN_CPUS:-8-15} PEERS=${PEERS:-redis,mooncake}
BUNDLE=${BUNDLE:-out/device/bundle.tar.xz} WORK=${WORK:-/tmp/kvtier-device} LIMIT_S=${LIMIT_S:-480}
MOONCAKE_SITE=.tools/mooncake/lib/python3.11/site-packages
PY311=${PY311:-$(readlink -f .tools/mooncake/bin/python3 2>/dev/null | sed 's|/bin/python3[.0-9]*$||')}
CARRY_MAX=$((64 << 20))

secs() { python3 -c 'import re,sys; v,u=re.fullmatch(r"([\d.]+)(ms|s)",sys.argv[1]).groups(); print(float(v)/(1000 if u=="ms" else 1))' "$1"; }

# Wall time of the run, from the bench's schedule: per workload, per
# concurrency, per repeat, kvtier and each peer for warm-up + duration, plus
# redis-benchmark once per concurrency, plus 60 s a workload for servers,
# Mooncake's start, the link probe and preloads (each measured at 2-10 s here).
estimate() {
  python3 - "$C" "$REPEAT" "$PEERS" "$(secs "$DURATION")" "$(secs "$WARMUP")" <<'EOF'
import sys
c, repeat, peers, dur, warm = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3].split(","), *map(float, sys.argv[4:])
systems = 1 + len([p for p in peers if p])
tool = len(c) * dur if "redis" in peers else 0
print(round(2 * (len(c) * repeat * systems * (warm + dur) + tool + 60)))
EOF
}

driver_args() { # $1: the kvtier binary, $2: the output directory
  echo "$2" --kvtier "$1" --duration "$DURATION" --warmup "$WARMUP" -c "$C" --repeat "$REPEAT" \
    --server-cpus "$SERVER_CPUS" --gen-cpus "$GEN_CPUS" --peers "$PEERS" --note 0
}

pack() {
  local stage size
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage/bin" "$stage/lib/redis" "$(dirname "$BUNDLE")"
  [ -x target/release/kvtier ] || { echo "target/release/kvtier missing: cargo build --release -p kvtier"; exit 1; }
  strip -o "$stage/bin/kvtier" target/release/kvtier
  for tool in redis-server redis-benchmark; do
    local real; real=$(readlink -f "$(command -v "$tool")")
    # redis-server is a link to redis-check-rdb, which picks its mode from argv[0]: copied under its own name.
    cp "$real" "$stage/lib/redis/$tool"
    ldd "$real" | awk '$3 ~ /^\// {print $3}' | grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
      xargs -r cp -Ln -t "$stage/lib/redis/"
    printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/../lib/redis\nLD_LIBRARY_PATH="$d" exec "$d/%s" "$@"\n' \
      "$tool" > "$stage/bin/$tool"
    chmod +x "$stage/bin/$tool"
  done
  if [[ ,$PEERS, == *,mooncake,* ]]; then
    [ -d "$MOONCAKE_SITE/mooncake" ] || { echo "Mooncake missing: scripts/setup-mooncake.sh"; exit 1; }
    local py="$stage/mooncake"
    mkdir -p "$py/bin" "$py/lib/python3.11/site-packages"
    cp "$PY311/bin/python3.11" "$py/bin/"
    cp "$PY311/lib/libpython3.11.so.1.0" "$py/lib/"
    tar -C "$PY311/lib" -cf - --exclude=python3.11/test --exclude=python3.11/site-packages \
      --exclude='python3.11/config-*' --exclude=python3.11/idlelib --exclude=python3.11/tkinter \
      --exclude=python3.11/turtledemo --exclude=python3.11/ensurepip --exclude=python3.11/lib2to3 \
      --exclude=__pycache__ python3.11 | tar -C "$py/lib" -xf -
    tar -C "$MOONCAKE_SITE" -cf - --exclude=__pycache__ --exclude=transfer_engine_bench --exclude=mooncake_client \
      mooncake mooncake_transfer_engine_non_cuda.libs \
      "$(cd "$MOONCAKE_SITE" && echo mooncake_transfer_engine_non_cuda-*.dist-info)" |
      tar -C "$py/lib/python3.11/site-packages" -xf -
    # libpython's RUNPATH names this machine's prefix: the wrapper says where it is now.
    printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")\nLD_LIBRARY_PATH="$d/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONHOME="$d/.." exec "$d/python3.11" "$@"\n' \
      > "$py/bin/python"
    chmod +x "$py/bin/python"
  fi
  git rev-parse HEAD > "$stage/COMMIT"
  nice -n 19 tar -C "$stage" -cf - . | nice -n 19 xz -T2 -6 > "$BUNDLE"
  size=$(stat -c %s "$BUNDLE")
  echo "wrote $BUNDLE: $((size >> 20)) MiB of the 64 MiB carry limit"
  [ "$size" -le "$CARRY_MAX" ] || { echo "too big to carry"; exit 1; }
}

run() {
  local dry=${1:-} est out
  est=$(estimate)
  out=${OUT:-out/device-data-plane}/data-plane
  echo "placement: systems on CPUs $SERVER_CPUS, generators on $GEN_CPUS; peers $PEERS; estimate ${est} s (limit ${LIMIT_S} s)"
  [ "$est" -le "$LIMIT_S" ] || { echo "estimated ${est} s is over ${LIMIT_S} s: fewer repeats, steps or seconds"; exit 1; }
  if [ "$dry" = --dry-run ]; then
    echo "carry: $BUNDLE (scripts/device-data-plane.sh pack)"
    echo "unpack: $WORK; PATH=$WORK/bin:\$PATH KVTIER_MOONCAKE_PYTHON=$WORK/mooncake/bin/python KVTIER_COMMIT=\$(cat $WORK/COMMIT)"
    # The driver checks the settings (CPU lists, peers) and prints its commands.
    [[ ,$PEERS, == *,mooncake,* ]] && export KVTIER_MOONCAKE_PYTHON="$WORK/mooncake/bin/python"
    # shellcheck disable=SC2046
    python3 scripts/bench-data-plane.py --dry-run $(driver_args "$WORK/bin/kvtier" "$out")
    return
  fi
  [ -f "$BUNDLE" ] || { echo "$BUNDLE not carried: scripts/device-data-plane.sh pack, then carry it"; exit 1; }
  # Python's tarfile, not tar -J: a bare machine may lack xz.
  mkdir -p "$WORK" && python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE" "$WORK"
  export PATH="$WORK/bin:$PATH" KVTIER_COMMIT; KVTIER_COMMIT=$(cat "$WORK/COMMIT")
  redis-server --version && redis-benchmark --version
  if [[ ,$PEERS, == *,mooncake,* ]]; then
    export KVTIER_MOONCAKE_PYTHON="$WORK/mooncake/bin/python"
    "$KVTIER_MOONCAKE_PYTHON" -c 'import mooncake.store, importlib.metadata as m; print("mooncake", m.version("mooncake-transfer-engine-non-cuda"))'
  fi
  "$WORK/bin/kvtier" --version
  nproc && mkdir -p "$out"
  # shellcheck disable=SC2046
  python3 scripts/bench-data-plane.py $(driver_args "$WORK/bin/kvtier" "$out")
}

case "${1:-}" in
  pack) pack ;;
  run) run "${2:-}" ;;
  *) echo "usage: scripts/device-data-plane.sh pack | run [--dry-run]"; exit 2 ;;
esac
