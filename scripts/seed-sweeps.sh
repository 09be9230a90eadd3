#!/usr/bin/env bash
# Reproduces the seeds' studies on this machine with the embedded server and
# Redis side by side (notes 004 and 005). Usage:
#   scripts/seed-sweeps.sh 004   # seed 000: 1.2 MB lookup/read/write (mixed), concurrency 1-200
#   scripts/seed-sweeps.sh 005   # seed 001: conversation workload, processes x concurrency
# Writes notes/NNN-*.json (the bench record with perf's header = the perf record) and the summary
# and report beside it in notes/NNN-*/. DURATION / WARMUP / REPEAT override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p kvtier
BIN=target/release/kvtier
DURATION=${DURATION:-3s}
WARMUP=${WARMUP:-1s}
REPEAT=${REPEAT:-3}
case "${1:?which note: 004 or 005}" in
  004)
    name=004-seed000-sweep
    args=(--workload mixed --value-size 1.2MB --concurrency 1,2,5,10,20,50,100,200
          --peer redis://spawn --probe --sla read.p99=100ms,lookup.p99=10ms,write.p99=100ms) ;;
  005)
    name=005-seed001-conversation
    args=(--workload conversation --api kvstore --processes 8 --concurrency 1,2,4,8,10
          --peer redis://spawn --sla read.p50=25ms,read.p50=30ms --target-tokens-per-s 1000000) ;;
  *) echo "unknown note $1"; exit 2 ;;
esac
out=notes/$name
rm -rf "$out"
"$BIN" bench "${args[@]}" --duration "$DURATION" --warmup "$WARMUP" --repeat "$REPEAT" --out "$out"
# perf's header (commit, dirty, versions) added to the bench's record (perf/README.md)
python3 -m perf.stamp "$out/record.json" --versions redis-server --kvtier "$BIN"
cp "$out/record.json" "notes/$name.json"
echo "perf record: notes/$name.json; summary: $out/summary.md; report: $out/report.html"
