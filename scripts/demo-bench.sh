#!/usr/bin/env bash
# Last step of `make demo`: a short latency-vs-concurrency sweep against the demo
# server (kvtier bench), written as record.json, summary.md and report.html.
# Usage: scripts/demo-bench.sh GRPC_ADDR OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${KVTIER_BIN:-target/release/kvtier}
addr=$1
out=$2/bench
"$BIN" bench --target "grpc://$addr" --workload mixed --value-size 1.2MB \
  --concurrency 1,4,16 --duration 2s --warmup 500ms --probe \
  --sla read.p99=50ms --out "$out"
python3 scripts/demo-summary.py "$2"
