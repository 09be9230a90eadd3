#!/usr/bin/env bash
# Reproduces notes/006-data-plane: 1.2 MB reads and writes over the data plane
# and over gRPC vs Redis (hand-written RESP2 peer client and redis-benchmark)
# in the same runs, plus 64-block lookups next to an empty gRPC round trip.
#
# Fairness:
#   * Core split (2 cores): the systems under test on core 1 (a release
#     `kvtier serve`, memory tier only, and redis-server), the generator (and
#     redis-benchmark, its child) on core 0. Only one of kvtier / Redis is under
#     load at a time, so each gets core 1 to itself, as a single-threaded Redis
#     would on any machine. kvtier's runtime sizes itself to its affinity: one
#     worker thread.
#   * The same memory budget: kvtier's memory tier and Redis's maxmemory are
#     both MEM; both store a new key per write and evict (allkeys-lru) once full.
#   * Repeats alternate kvtier and Redis (REPEAT each), so drift on a shared
#     machine hits both.
#   * The `*-syscc` runs repeat the data-plane runs with kvtier's sockets on the
#     system's default congestion control (as Redis's are), to show what the
#     data plane's own choice (reno, server.data_tcp_congestion) is worth.
#   * SYSTEM_CC=reno (root only, opt-in) additionally switches the *system*
#     default to reno for one more pair of runs, so Redis and redis-benchmark
#     get reno too; the original value is restored on exit.
#
# Usage: scripts/bench-data-plane.sh [OUT_DIR]
#   env: DURATION=5s WARMUP=2s C=1,8,32 SIZE=1.2MB MEM=2GiB REPEAT=3 SYSTEM_CC=
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/006-data-plane}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-2s}
C=${C:-1,8,32}
SIZE=${SIZE:-1.2MB}
MEM=${MEM:-2GiB}
REPEAT=${REPEAT:-3}
SYSTEM_CC=${SYSTEM_CC:-}
SERVER_CPU=${SERVER_CPU:-1}
GEN_CPU=${GEN_CPU:-0}
BIN=target/release/kvtier
[ -x "$BIN" ] || cargo build --release -p kvtier
mkdir -p "$OUT"
# Redis spells GiB "gb" (1024^3).
REDIS_MEM=$(echo "$MEM" | sed -E 's/GiB$/gb/; s/MiB$/mb/')

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=()
ORIG_CC=$(cat /proc/sys/net/ipv4/tcp_congestion_control)
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  if [ "$(cat /proc/sys/net/ipv4/tcp_congestion_control)" != "$ORIG_CC" ]; then
    echo "$ORIG_CC" > /proc/sys/net/ipv4/tcp_congestion_control
  fi
}
trap cleanup EXIT

wait_port() { for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened"; exit 1; }

start_systems() { # (re)starts redis-server and kvtier serve; sets RP, GP
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  PIDS=()
  RP=$(free_port)
  taskset -c "$SERVER_CPU" redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no \
    --protected-mode no --maxmemory "$REDIS_MEM" --maxmemory-policy allkeys-lru >/dev/null 2>&1 &
  PIDS+=($!)
  GP=$(free_port)
  taskset -c "$SERVER_CPU" "$BIN" serve --listen "127.0.0.1:$GP" --data-listen auto --http-listen "" \
    --memory-capacity "$MEM" "$@" >>"$OUT/server.log" 2>&1 &
  PIDS+=($!)
  wait_port "$GP"; wait_port "$RP"
}

bench() {
  echo "== bench $*"
  taskset -c "$GEN_CPU" "$BIN" bench --target "grpc://127.0.0.1:$GP" --peer "redis://127.0.0.1:$RP" \
    --duration "$DURATION" --warmup "$WARMUP" --repeat "${BENCH_REPEAT:-$REPEAT}" --quiet "$@"
}

echo "system congestion control: $ORIG_CC" | tee "$OUT/env.txt"
start_systems
for w in read write; do
  # The issue's command: data plane (auto) vs Redis through the RESP2 client, + redis-benchmark + link probe.
  bench --workload $w --value-size "$SIZE" --concurrency "$C" --peer-tool --probe --out "$OUT/$w-wire"
  # gRPC path as-is (tuned tonic), same Redis runs again for its own ratio.
  bench --workload $w --value-size "$SIZE" --concurrency "$C" --transport grpc --out "$OUT/$w-grpc"
done
BENCH_REPEAT=1 bench --workload lookup-ping --concurrency "$C" --out "$OUT/lookup-ping"

# Ablation: kvtier's data-plane sockets on the system default congestion control.
start_systems --data-tcp-congestion ""
for w in read write; do
  bench --workload $w --value-size "$SIZE" --concurrency "$C" --data-tcp-congestion "" --out "$OUT/$w-wire-syscc"
done

if [ -n "$SYSTEM_CC" ]; then
  echo "$SYSTEM_CC" > /proc/sys/net/ipv4/tcp_congestion_control
  echo "system congestion control for *-sys$SYSTEM_CC: $SYSTEM_CC" | tee -a "$OUT/env.txt"
  start_systems
  for w in read write; do
    bench --workload $w --value-size "$SIZE" --concurrency "$C" --peer-tool --out "$OUT/$w-wire-sys$SYSTEM_CC"
  done
fi
echo "records under $OUT/"
