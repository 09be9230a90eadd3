#!/usr/bin/env bash
# Re-runnable measurement for notes/003-object-store-tier.{md,json}: 1.2 MB reads
# cold (object store) / warm (disk) / hot (memory) at concurrency 1, 4, 16, 32,
# 64-block chain lookups local vs store, and Azurite's own put/get as the floor.
# Usage: scripts/bench-object-store.sh [OUT.json]   (REPEATS=3 by default; PROFILE=release)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
OUT=${1:-notes/003-object-store-tier.json}
PROFILE=${PROFILE:-release}
flag=(); [ "$PROFILE" = release ] && flag=(--release)
export BENCH_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
export BENCH_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo "-dirty")
export BENCH_MACHINE="$(uname -srm); $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
export BENCH_COMMAND="PROFILE=$PROFILE REPEATS=${REPEATS:-3} scripts/bench-object-store.sh $OUT"
cargo run -q "${flag[@]}" -p kvtier-server --example object_bench -- "$OUT"
# The example writes date, commit and machine from BENCH_*; perf adds the rest of its header.
python3 -m perf.stamp "$OUT" --versions azurite
