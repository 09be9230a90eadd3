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
# The example writes date, commit, machine and command from BENCH_*, which perf
# measures (perf/stamp.py, --env); perf.stamp then adds the rest of the header.
eval "$(python3 -m perf.stamp --env --command "PROFILE=$PROFILE REPEATS=${REPEATS:-3} scripts/bench-object-store.sh $OUT")"
cargo run -q "${flag[@]}" -p kvtier-server --example object_bench -- "$OUT"
python3 -m perf.stamp "$OUT" --versions azurite
