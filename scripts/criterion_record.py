#!/usr/bin/env python3
"""Collects criterion estimates into a perf record (date, commit, machine, command, results)."""
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

command, root, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
results = {}
for est in sorted(root.glob("*/*/*/new/estimates.json")) + sorted(root.glob("*/*/new/estimates.json")):
    bench_dir = est.parent.parent
    name = str(bench_dir.relative_to(root))
    e = json.loads(est.read_text())
    bm = json.loads((est.parent / "benchmark.json").read_text())
    tp = bm.get("throughput") or {}
    elems = tp.get("Elements") or tp.get("elements") or 1
    med = e["median"]["point_estimate"]  # ns per iteration
    results[name] = {
        "median_ns_per_iter": med,
        "ci95_ns": [e["median"]["confidence_interval"]["lower_bound"], e["median"]["confidence_interval"]["upper_bound"]],
        "elements_per_iter": elems,
        "ops_per_s": elems * 1e9 / med if med else None,
    }
mem_kib = int(next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1])
record = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "machine": {"cpus": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1), "kernel": platform.release(),
                "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")},
    "command": command,
    "results": results,
}
out.write_text(json.dumps(record, indent=1) + "\n")
print(f"wrote {out} ({len(results)} benchmarks)")
