#!/usr/bin/env bash
# Disk-tier benchmark: raw-device baseline (fio, or dd when fio is missing) and
# the in-process tier benchmark (crates/kvtier-core/examples/disk_bench.rs) in
# one run, on the filesystem holding $BENCH_DIR. Writes the perf record
# ($OUT_JSON, default notes/002-disk-tier.json) with medians over $REPEATS
# repeats and ratios to the baseline. Deletes its data afterwards.
#
#   scripts/bench-disk.sh                       # full run (10 GiB restart set)
#   RESTART_GIB=1 REPEATS=3 scripts/bench-disk.sh
#
# Needs ~RESTART_GIB + 3 GiB free. Run as root for cold-cache numbers (it
# writes /proc/sys/vm/drop_caches); otherwise only page-cache-warm reads.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_DIR=${BENCH_DIR:-target/bench-disk-tmp}
REPEATS=${REPEATS:-3}
BLOCKS=${BLOCKS:-256}
CONC=${CONC:-1,4,16}
RESTART_GIB=${RESTART_GIB:-10}
RAW_MIB=${RAW_MIB:-2048}
OUT_JSON=${OUT_JSON:-notes/002-disk-tier.json}
RAW_DIR="$BENCH_DIR/raw"
rm -rf "$BENCH_DIR"
mkdir -p "$RAW_DIR"
trap 'rm -rf "$BENCH_DIR"' EXIT

cargo build --release -p kvtier-core --example disk_bench >&2
BENCH=target/release/examples/disk_bench

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }

# --- Raw baseline: MB/s per repeat, one JSON object per line in raw.jsonl -------
raw="$BENCH_DIR/raw.jsonl"
: >"$raw"
f="$RAW_DIR/seq.bin"
for r in $(seq 1 "$REPEATS"); do
  if command -v fio >/dev/null; then
    common=(--name=raw --filename="$f" --size="${RAW_MIB}M" --output-format=json --end_fsync=1)
    # Sequential 1 MiB direct I/O, queue depth 1 and 16.
    for qd in 1 16; do
      drop_caches
      mbs=$(fio "${common[@]}" --rw=write --bs=1M --direct=1 --ioengine=libaio --iodepth=$qd |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"]/1e6)')
      echo "{\"test\":\"seq-write-direct-qd$qd\",\"tool\":\"fio\",\"repeat\":$r,\"mb_per_s\":$mbs}" >>"$raw"
      drop_caches
      mbs=$(fio "${common[@]}" --rw=read --bs=1M --direct=1 --ioengine=libaio --iodepth=$qd |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/1e6)')
      echo "{\"test\":\"seq-read-direct-qd$qd\",\"tool\":\"fio\",\"repeat\":$r,\"mb_per_s\":$mbs}" >>"$raw"
    done
    # What `--disk-sync always` asks of the device: 1.2 MB buffered writes,
    # fdatasync after each, one writer (the disk tier also renames and fsyncs
    # the directory).
    rm -f "$f"
    mbs=$(fio --name=raw --filename="$f" --size=600M --output-format=json --rw=write --bs=1200k \
      --ioengine=psync --fdatasync=1 |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"]/1e6)')
    echo "{\"test\":\"write-1200k-fdatasync-each\",\"tool\":\"fio\",\"repeat\":$r,\"mb_per_s\":$mbs}" >>"$raw"
  fi
  # dd, always (also the fallback): 1 MiB direct sequential write and read.
  drop_caches
  s=$(dd if=/dev/zero of="$f.dd" bs=1M count="$RAW_MIB" oflag=direct conv=fsync 2>&1 | tail -1)
  echo "{\"test\":\"seq-write-direct-dd\",\"tool\":\"dd\",\"repeat\":$r,\"mb_per_s\":$(python3 -c "import sys; w=sys.argv[1].split(', '); print($RAW_MIB*1048576/float(w[2].split()[0])/1e6)" "$s")}" >>"$raw"
  drop_caches
  s=$(dd if="$f.dd" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1)
  echo "{\"test\":\"seq-read-direct-dd\",\"tool\":\"dd\",\"repeat\":$r,\"mb_per_s\":$(python3 -c "import sys; w=sys.argv[1].split(', '); print($RAW_MIB*1048576/float(w[2].split()[0])/1e6)" "$s")}" >>"$raw"
  rm -f "$f" "$f.dd"
done
echo "raw baseline:" >&2
cat "$raw" >&2

# --- Tiers ----------------------------------------------------------------------
cmd=("$BENCH" --dir "$BENCH_DIR/tiers" --blocks "$BLOCKS" --conc "$CONC" --repeats "$REPEATS" --restart-gib "$RESTART_GIB")
"${cmd[@]}" >"$BENCH_DIR/tiers.json"

# --- Record: medians, ratios, machine -------------------------------------------
python3 - "$raw" "$BENCH_DIR/tiers.json" "$OUT_JSON" "${cmd[*]}" "$BENCH_DIR" <<'EOF'
import json, os, statistics, subprocess, sys
from perf import header, versions, write_record  # run from the repository root: perf/ is on sys.path
raw_path, tiers_path, out_path, cmd, bench_dir = sys.argv[1:6]
raw = [json.loads(l) for l in open(raw_path) if l.strip()]
tiers = json.load(open(tiers_path))
med = statistics.median
baseline = {}
for t in sorted({r["test"] for r in raw}):
    xs = [r["mb_per_s"] for r in raw if r["test"] == t]
    baseline[t] = {"median_mb_per_s": med(xs), "runs": xs, "tool": next(r["tool"] for r in raw if r["test"] == t)}
def base(name):
    return baseline.get(name, {}).get("median_mb_per_s")
seq_write = base("seq-write-direct-qd16") or base("seq-write-direct-dd")
seq_read = base("seq-read-direct-qd16") or base("seq-read-direct-dd")
rows = []
keys = sorted({(r["tier"], r["op"], r["conc"]) for r in tiers["results"]}, key=lambda k: (k[0], k[1], k[2]))
for tier, op, conc in keys:
    ss = [r["sample"] for r in tiers["results"] if (r["tier"], r["op"], r["conc"]) == (tier, op, conc)]
    row = {"tier": tier, "op": op, "conc": conc, "repeats": len(ss)}
    for f in ("mb_per_s", "ops_per_s", "p50_ms", "p99_ms"):
        row[f] = round(med([s[f] for s in ss]), 3)
    b = seq_write if op == "write" else seq_read
    row["ratio_to_raw_seq"] = round(row["mb_per_s"] / b, 3) if b else None
    rows.append(row)
restart = tiers.get("restart")
if restart:
    for v in (True, False):
        xs = [r["open_seconds"] for r in restart["runs"] if r["verify_on_open"] == v]
        if xs:
            gb = restart["blocks"] * restart["block_bytes"] / 1e9
            restart[f"median_open_seconds_verify_{str(v).lower()}"] = round(med(xs), 3)
            restart[f"median_scan_mb_per_s_verify_{str(v).lower()}"] = round(gb * 1e3 / med(xs), 1)
    if seq_read and "median_scan_mb_per_s_verify_true" in restart:
        restart["verify_true_ratio_to_raw_seq_read"] = round(restart["median_scan_mb_per_s_verify_true"] / seq_read, 3)
def sh(c):
    try:
        return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception:
        return None
dev = sh(f"df --output=source,fstype,size {bench_dir} | tail -1")
head = header(command="scripts/bench-disk.sh  (" + cmd + ")", versions=versions("fio"))
head["machine"]["disk"] = dev
head["machine"]["disk_rotational_flag"] = sh(
    "cat /sys/block/$(basename $(df --output=source " + bench_dir + " | tail -1))/queue/rotational 2>/dev/null")
write_record(out_path, {
    "method": tiers["mode"] + "; raw baseline by fio/dd on the same filesystem in the same run; medians over repeats",
    "block_bytes": tiers["block_bytes"],
    "blocks_per_phase": tiers["blocks_per_phase"],
    "cold_reads_drop_page_cache": tiers["page_cache_dropped_for_cold_reads"],
    "baseline": baseline,
    "baseline_used_for_ratios": {"write_mb_per_s": seq_write, "read_mb_per_s": seq_read},
    "results": rows,
    "restart": restart,
    "raw_samples": tiers["results"],
}, head, indent=2)
print(f"{'tier':<12}{'op':<11}{'conc':>5}{'MB/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'x raw':>8}", file=sys.stderr)
for r in rows:
    print(f"{r['tier']:<12}{r['op']:<11}{r['conc']:>5}{r['mb_per_s']:>10.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{(r['ratio_to_raw_seq'] or 0):>8.2f}", file=sys.stderr)
if restart:
    print({k: v for k, v in restart.items() if k != "runs"}, file=sys.stderr)
EOF
