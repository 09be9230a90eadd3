#!/usr/bin/env bash
# notes/007-allocator: 1.2 MB writes over the data plane with the server on
# glibc malloc (default settings), glibc with large-buffer tunables, and
# jemalloc (the default build), interleaved in one run, ROUNDS times.
# Server pinned to core 1, generator to core 0 (as scripts/bench-data-plane.sh).
# Usage: scripts/bench-allocator.sh   (env: ROUNDS=2 DURATION=3s C=1,8)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-3s}
C=${C:-1,8}
OUT=${OUT:-out/007-allocator}
mkdir -p "$OUT/bin"
cargo build --release -q -p kvtier --no-default-features && cp target/release/kvtier "$OUT/bin/kvtier-glibc"
cargo build --release -q -p kvtier && cp target/release/kvtier "$OUT/bin/kvtier-jemalloc"
TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
run() { # name binary tunables round
  local name=$1 bin=$2 tun=$3 round=$4 port pid
  port=$(free_port)
  taskset -c 1 env GLIBC_TUNABLES="$tun" "$bin" serve --listen "127.0.0.1:$port" --http-listen "" \
    --memory-capacity 3GiB >"$OUT/$name-$round.server.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  taskset -c 0 "$OUT/bin/kvtier-jemalloc" bench --target "grpc://127.0.0.1:$port" --workload write \
    --value-size 1.2MB --concurrency "$C" --duration "$DURATION" --warmup 1s -q --out "$OUT/$name-$round" >/dev/null
  kill -TERM $pid; wait $pid || true
}
for r in $(seq "$ROUNDS"); do
  run glibc "$OUT/bin/kvtier-glibc" "" "$r"
  run glibc-tunables "$OUT/bin/kvtier-glibc" "$TUNABLES" "$r"
  run jemalloc "$OUT/bin/kvtier-jemalloc" "" "$r"
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, statistics
from perf import header, versions, write_record  # run from the repository root: perf/ is on sys.path
out, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for name in ["glibc", "glibc-tunables", "jemalloc"]:
    for r in range(1, rounds + 1):
        rec = json.load(open(f"{out}/{name}-{r}/record.json"))
        for st in rec["steps"]:
            c = f"c={st['mode']['concurrency']}"
            op = st["ops"]["write"]
            e2e = op["latency_us"]["e2e"]
            res.setdefault(name, {}).setdefault(c, []).append(
                {"ops_per_s": op["throughput_ops_s"], "p50_us": e2e["p50"], "p99_us": e2e["p99"]})
summary = {n: {c: {"median_ops_per_s": statistics.median(x["ops_per_s"] for x in v),
                   "median_p50_us": statistics.median(x["p50_us"] for x in v),
                   "median_p99_us": statistics.median(x["p99_us"] for x in v), "runs": v}
               for c, v in cs.items()} for n, cs in res.items()}
head = header(command=f"ROUNDS={rounds} scripts/bench-allocator.sh",
              versions=versions("kvtier", paths={"kvtier": f"{out}/bin/kvtier-jemalloc"}))
write_record("notes/007-allocator.json", {"results": summary}, head)
for n, cs in summary.items():
    for c, v in cs.items():
        print(f"{n:16s} {c:10s} {v['median_ops_per_s']:8.0f} ops/s  p50 {v['median_p50_us']/1000:6.2f} ms  p99 {v['median_p99_us']/1000:6.2f} ms")
PY
