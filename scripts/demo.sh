#!/usr/bin/env bash
# make demo: start kvtier on its embedded defaults (loopback, ephemeral ports),
# drive a multi-turn prompt workload through the Rust client, write a report, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${KVTIER_BIN:-target/release/kvtier}
OUT=${OUT:-out/demo}
mkdir -p "$OUT"
ready="$OUT/ready.json"
rm -f "$ready"
# Embedded default tiers: memory in front of a local disk tier. Memory is kept
# small (64 MiB) so the workload overflows it and reads are served from disk too.
rm -rf "$OUT/data"
"$BIN" serve --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --ready-json \
  --memory-capacity 64MiB --disk-dir "$OUT/data" --disk-capacity 4GiB >"$ready" 2>"$OUT/server.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
# Wait for readiness by probing (bounded), never a fixed sleep.
for _ in $(seq 1 200); do
  [ -s "$ready" ] && break
  kill -0 $pid 2>/dev/null || { echo "kvtier exited during start-up:"; cat "$OUT/server.log"; exit 1; }
  sleep 0.05
done
[ -s "$ready" ] || { echo "kvtier did not become ready"; exit 1; }
grpc=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["grpc"][0])' "$ready")
http=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["http"])' "$ready")
echo "kvtier serving: gRPC $grpc, HTTP $http (pid $pid)"
"$BIN" demo --server "http://$grpc" --out "$OUT"
curl -fsS "http://$http/metrics" > "$OUT/metrics.txt" && echo "metrics snapshot: $OUT/metrics.txt"
echo "running a short kvtier bench sweep (about 20 s; log: $OUT/bench.log)"
scripts/demo-bench.sh "$grpc" "$OUT" > "$OUT/bench.log" 2>&1 || { cat "$OUT/bench.log"; exit 1; }
sed -n '/== kvtier demo: summary ==/,$p' "$OUT/bench.log"
