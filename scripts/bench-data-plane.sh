#!/usr/bin/env bash
# Reproduces notes/026-comparisons (notes/013's rules, the current binary): kvtier (data plane) vs Redis vs Mooncake
# Store, 1.2 MB reads and writes of memory-tier hits at c = 1, 8, 32, under the
# comparison rules of docs/bench.md ("Comparisons"):
#
#   1. Every system on the same congestion control: the machine's default
#      (kvtier's server and client use it unless told otherwise), or the one
#      SYSTEM_CC names, set for the whole machine for the run and restored on
#      exit (root). The bench records what each system's sockets really ran.
#   2. Redis: the better of the bench's own client and redis-benchmark (SET
#      with a key range, so each makes a new key as kvtier's writes do).
#      Mooncake: its own Python API from separate processes (no store
#      benchmark tool ships with it; the bench records that).
#   3. Steps where a generator is saturated, or that had errors, get no ratio;
#      medians over REPEAT alternating repeats; outlier repeats are listed.
#   4. The note's tables, its perf record and notes/README.md's table are generated
#      from the records by scripts/note-comparisons.py.
#
# Placement (2 cores): the systems under test (kvtier serve, redis-server,
# Mooncake's master and its memory segment) on SERVER_CPU, the generators
# (kvtier bench, redis-benchmark, the Mooncake driver's workers) on GEN_CPU.
# Only one system is under load at a time. Each holds MEM (kvtier's memory
# tier, Redis maxmemory with allkeys-lru, Mooncake's segment).
#
# Usage: scripts/bench-data-plane.sh [OUT_DIR]
#   env: DURATION=3s WARMUP=1s C=1,8,32 SIZE=1258291 REPEAT=3 SYSTEM_CC=
#        SERVER_CPU=1 GEN_CPU=0 NOTE=1 (0: records only, no note/notes/README.md update)
#        NOTE_PATH=notes/026-comparisons (the note whose tables and record are written)
#        SERVER_MALLOC_CONF= (jemalloc options for kvtier serve only, e.g.
#        dirty_decay_ms:-1 for notes/017; recorded in OUT/server-env.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/026-comparisons}
DURATION=${DURATION:-3s}
WARMUP=${WARMUP:-1s}
C=${C:-1,8,32}
SIZE=${SIZE:-1258291}
REPEAT=${REPEAT:-3}
SYSTEM_CC=${SYSTEM_CC:-}
SERVER_CPU=${SERVER_CPU:-1}
GEN_CPU=${GEN_CPU:-0}
NOTE=${NOTE:-1}
NOTE_PATH=${NOTE_PATH:-notes/026-comparisons}
SERVER_MALLOC_CONF=${SERVER_MALLOC_CONF:-}
BIN=target/release/kvtier
cargo build --release -q -p kvtier
scripts/setup-mooncake.sh
mkdir -p "$OUT"

ORIG_CC=$(cat /proc/sys/net/ipv4/tcp_congestion_control)
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  if [ "$(cat /proc/sys/net/ipv4/tcp_congestion_control)" != "$ORIG_CC" ]; then
    echo "$ORIG_CC" > /proc/sys/net/ipv4/tcp_congestion_control
  fi
}
trap cleanup EXIT
if [ -n "$SYSTEM_CC" ]; then
  echo "$SYSTEM_CC" > /proc/sys/net/ipv4/tcp_congestion_control
fi
echo "congestion control for every system: $(cat /proc/sys/net/ipv4/tcp_congestion_control)"

start_server() { # a fresh kvtier serve on SERVER_CPU; sets SERVER_PID, GRPC
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID"; wait "$SERVER_PID" || true; fi
  rm -f "$OUT/ready.json"
  echo "_RJEM_MALLOC_CONF=$SERVER_MALLOC_CONF" > "$OUT/server-env.txt"
  _RJEM_MALLOC_CONF="$SERVER_MALLOC_CONF" taskset -c "$SERVER_CPU" "$BIN" serve --listen 127.0.0.1:0 --data-listen auto --http-listen "" \
    --memory-capacity 2GiB --ready-json >"$OUT/ready.json" 2>>"$OUT/server.log" &
  SERVER_PID=$!
  for _ in $(seq 600); do
    [ -s "$OUT/ready.json" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "kvtier serve exited; see $OUT/server.log"; exit 1; }
    sleep 0.05
  done
  GRPC=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["grpc"][0])' "$OUT/ready.json")
}

for w in read write; do
  start_server
  echo "== $w"
  taskset -c "$GEN_CPU" "$BIN" bench --target "grpc://$GRPC" --workload "$w" --value-size "$SIZE" \
    --concurrency "$C" --duration "$DURATION" --warmup "$WARMUP" --repeat "$REPEAT" \
    --peer redis://spawn,mooncake://spawn --peer-tool --peer-cpus "$SERVER_CPU" --probe \
    --out "$OUT/$w"
  python3 -m perf.stamp "$OUT/$w/record.json" --versions redis-server,redis-benchmark,mooncake --kvtier "$BIN"
done

if [ "$NOTE" = 1 ]; then
  python3 scripts/note-comparisons.py "$OUT" --note "$NOTE_PATH" \
    --command "DURATION=$DURATION WARMUP=$WARMUP C=$C SIZE=$SIZE REPEAT=$REPEAT SYSTEM_CC=$SYSTEM_CC SERVER_CPU=$SERVER_CPU GEN_CPU=$GEN_CPU SERVER_MALLOC_CONF=$SERVER_MALLOC_CONF NOTE_PATH=$NOTE_PATH scripts/bench-data-plane.sh $OUT"
fi
echo "records under $OUT/"
