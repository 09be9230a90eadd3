#!/usr/bin/env python3
"""Turns the records of scripts/bench-data-plane.sh into the perf record
notes/006-data-plane.json and the markdown tables of notes/006-data-plane.md.

Usage: scripts/note-data-plane.py OUT_DIR [JSON_OUT]
Prints the tables; writes JSON_OUT (default notes/006-data-plane.json),
keeping keys of an existing JSON_OUT that it does not compute (the note's
target verdicts and profile shares, written after reading the tables).
Throughput is over all repeats (kvtier and Redis repeats alternate); the
per-repeat values are listed in brackets; p50/p99 come from merged histograms.
"""
import json
import os
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else "out/006-data-plane"
JSON_OUT = sys.argv[2] if len(sys.argv) > 2 else "notes/006-data-plane.json"


def load(name):
    p = os.path.join(OUT, name, "record.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def op_of(step):
    return next(iter(step["ops"].values()))


def stats(step):
    o = op_of(step)
    e = o["latency_us"]["e2e"]
    reps = [r["throughput_ops_s"] for r in o.get("per_repeat", [])]
    return {
        "ops_s": round(o["throughput_ops_s"], 1),
        "repeats_ops_s": [round(x) for x in reps],
        "p50_ms": round(e["p50"] / 1000, 3),
        "p99_ms": round(e["p99"] / 1000, 3),
    }


def by_c(rec, peer=False):
    steps = rec["peer"]["steps"] if peer else rec["steps"]
    return {str(s["mode"]["concurrency"]): stats(s) for s in steps}


def tool(rec, op):
    ref = rec.get("peer_reference") or {}
    return {
        str(r["concurrency"]): {"ops_s": round(r["throughput_ops_s"], 1)}
        for r in ref.get("rows", [])
        if r["op"] == op
    }


def fmt(x):
    return f"{x['ops_s']:,.0f}" if x else "–"


result = {}
first = None
for w in ("read", "write"):
    sec = {}
    for variant, label in (
        ("wire", "data_plane"),
        ("grpc", "grpc"),
        ("wire-syscc", "data_plane_system_cc"),
        ("wire-sysreno", "data_plane_system_reno"),
    ):
        rec = load(f"{w}-{variant}")
        if rec is None:
            continue
        first = first or rec
        sec[label] = by_c(rec)
        if rec.get("peer"):
            sec[f"redis_resp2_same_run_as_{label}"] = by_c(rec, peer=True)
        t = tool(rec, "get" if w == "read" else "set")
        if t:
            sec[f"redis_benchmark_same_run_as_{label}"] = t
        if rec.get("link_probe") and "link_probe_gbit_s" not in result:
            result["link_probe_gbit_s"] = round(rec["link_probe"]["gbit_per_s"], 1)
    result[w] = sec

lp = load("lookup-ping")
if lp:
    rows = {}
    for s in lp["steps"]:
        c = str(s["mode"]["concurrency"])
        lk = s["ops"]["lookup"]
        pg = s["ops"]["ping"]
        rows[c] = {
            "lookup_p50_ms": round(lk["latency_us"]["e2e"]["p50"] / 1000, 3),
            "ping_p50_ms": round(pg["latency_us"]["e2e"]["p50"] / 1000, 3),
            "ratio": round(lk["latency_us"]["e2e"]["p50"] / max(pg["latency_us"]["e2e"]["p50"], 1), 2),
            "lookups_s": round(lk["throughput_ops_s"]),
            "block_checks_s": round(lk["throughput_ops_s"] * 64),
        }
    result["lookup_vs_ping"] = rows

env = ""
if os.path.exists(os.path.join(OUT, "env.txt")):
    env = open(os.path.join(OUT, "env.txt")).read().strip()

record = {
    "note": "006-data-plane",
    "date": first["date"] if first else None,
    "git_commit": first["git_commit"] if first else None,
    "machine": first["machine"] if first else None,
    "command": os.environ.get(
        "NOTE_COMMAND",
        f"DURATION=3s WARMUP=1s REPEAT=3 SYSTEM_CC=reno scripts/bench-data-plane.sh {OUT}",
    ),
    "environment": env,
    "split": {"server_and_redis_cpu": 1, "generator_cpu": 0, "server_runtime_workers": 1},
    "records": sorted(
        os.path.join(OUT, d, "record.json")
        for d in os.listdir(OUT)
        if os.path.exists(os.path.join(OUT, d, "record.json"))
    ),
    "results": result,
}
os.makedirs(os.path.dirname(JSON_OUT) or ".", exist_ok=True)
# Keys written by hand (targets, profiles) survive a re-run; computed ones are replaced.
if os.path.exists(JSON_OUT):
    with open(JSON_OUT) as f:
        old = json.load(f)
    record = {**{k: v for k, v in old.items() if k not in record}, **record}
with open(JSON_OUT, "w") as f:
    json.dump(record, f, indent=1)

# Markdown tables.
for w in ("read", "write"):
    sec = result.get(w, {})
    if not sec:
        continue
    cs = sorted(sec.get("data_plane", {}), key=int)
    print(f"\n{w} 1.2 MB — ops/s (p50 / p99 ms); [repeats]\n")
    print("| variant | " + " | ".join(f"c={c}" for c in cs) + " |")
    print("|---|" + "---|" * len(cs))
    for k, v in sec.items():
        cells = []
        for c in cs:
            x = v.get(c)
            if not x:
                cells.append("–")
            elif "p50_ms" in x:
                cells.append(
                    f"{x['ops_s']:,.0f} ({x['p50_ms']:.2f} / {x['p99_ms']:.2f}) {x['repeats_ops_s']}"
                )
            else:
                cells.append(fmt(x))
        print(f"| {k} | " + " | ".join(cells) + " |")
    # Ratios within the same run.
    print()
    for label in ("data_plane", "grpc", "data_plane_system_cc", "data_plane_system_reno"):
        kv = sec.get(label)
        rd = sec.get(f"redis_resp2_same_run_as_{label}")
        rb = sec.get(f"redis_benchmark_same_run_as_{label}")
        if not kv or not rd:
            continue
        parts = []
        for c in cs:
            s = f"c={c}: {kv[c]['ops_s'] / rd[c]['ops_s']:.2f}× RESP2"
            s += f", p99 {kv[c]['p99_ms'] / rd[c]['p99_ms']:.2f}×"
            if rb and c in rb:
                s += f", {kv[c]['ops_s'] / rb[c]['ops_s']:.2f}× redis-benchmark"
            parts.append(s)
        print(f"* {w} {label} / Redis (same run): " + "; ".join(parts))
if lp:
    print("\nlookup (64 blocks) vs empty gRPC round trip\n")
    print("| c | lookup p50 ms | ping p50 ms | ratio | lookups/s | block-checks/s |")
    print("|---|---|---|---|---|---|")
    for c, x in sorted(result["lookup_vs_ping"].items(), key=lambda kv: int(kv[0])):
        print(
            f"| {c} | {x['lookup_p50_ms']:.2f} | {x['ping_p50_ms']:.2f} | {x['ratio']:.2f}× | "
            f"{x['lookups_s']:,} | {x['block_checks_s']:,} |"
        )
print(f"\nwrote {JSON_OUT}")
