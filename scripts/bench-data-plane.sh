#!/usr/bin/env bash
# Reproduces notes/006-data-plane: 1.2 MB reads and writes over the data plane
# and over gRPC vs Redis (hand-written RESP2 peer client, the redis crate, and
# redis-benchmark) in the same runs, plus 64-block lookups next to an empty
# gRPC round trip.
#
# Core split (2 cores): the systems under test on core 1 (a release
# `kvtier serve`, memory tier only, and redis-server), the generator (and
# redis-benchmark, its child) on core 0. Only one of kvtier / Redis is under
# load at a time, so each gets core 1 to itself, as a single-threaded Redis
# would on any machine. kvtier's runtime sizes itself to its affinity: one
# worker thread.
#
# Usage: scripts/bench-data-plane.sh [OUT_DIR]   (env: DURATION=10s WARMUP=2s C=1,8,32 SIZE=1.2MB)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/006-data-plane}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
C=${C:-1,8,32}
SIZE=${SIZE:-1.2MB}
SERVER_CPU=${SERVER_CPU:-1}
GEN_CPU=${GEN_CPU:-0}
BIN=target/release/kvtier
[ -x "$BIN" ] || cargo build --release -p kvtier
mkdir -p "$OUT"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

RP=$(free_port)
taskset -c "$SERVER_CPU" redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no \
  --protected-mode no --maxmemory 4gb --maxmemory-policy allkeys-lru >/dev/null 2>&1 &
PIDS+=($!)
GP=$(free_port)
# glibc malloc: every 1.2 MB write needs a fresh buffer (the memory tier keeps
# it); above the default mmap threshold each one is a new mapping, first-touch
# page faults and page clearing ~40% of the server's CPU (perf, note 006).
# Serve large buffers from the heap and do not trim it (Redis's jemalloc
# reuses freed extents the same way). KVTIER_MALLOC_TUNABLES= disables this.
MALLOC_TUNABLES=${KVTIER_MALLOC_TUNABLES-glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824}
taskset -c "$SERVER_CPU" env GLIBC_TUNABLES="$MALLOC_TUNABLES" "$BIN" serve --listen "127.0.0.1:$GP" --data-listen auto --http-listen "" \
  --memory-capacity 3GiB >"$OUT/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/$GP) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/$RP) 2>/dev/null && break
  sleep 0.1
done
T="grpc://127.0.0.1:$GP"
PEER="redis://127.0.0.1:$RP"
bench() {
  echo "== bench $*"
  taskset -c "$GEN_CPU" "$BIN" bench --target "$T" --peer "$PEER" --duration "$DURATION" --warmup "$WARMUP" "$@"
}

for w in read write; do
  # The issue's command: data plane (auto) vs Redis through the RESP2 client, + redis-benchmark + link probe.
  bench --workload $w --value-size "$SIZE" --concurrency "$C" --peer-tool --probe --out "$OUT/$w-wire"
  # gRPC path as-is (tuned tonic) vs Redis through the redis crate (the old peer client).
  bench --workload $w --value-size "$SIZE" --concurrency "$C" --transport grpc --peer-client redis-rs --out "$OUT/$w-grpc"
done
bench --workload lookup-ping --concurrency "$C" --out "$OUT/lookup-ping"
echo "records under $OUT/"
