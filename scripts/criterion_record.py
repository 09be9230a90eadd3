#!/usr/bin/env python3
"""Collects criterion estimates into a perf record (perf's header, then the
results). Usage: criterion_record.py COMMAND CRITERION_DIR OUT.json, COMMAND
being what ran the benchmarks (scripts/bench-engine.sh)."""
import json
import sys
from pathlib import Path

import _perf  # noqa: F401 (puts perf on sys.path)

from perf import header, versions, write_record

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
write_record(out, {"results": results}, header(command=command, versions=versions("rustc", "cargo")))
print(f"{len(results)} benchmarks")
