#!/usr/bin/env python3
"""The last lines of `make demo`: a short, complete summary of what happened
and the paths of everything written. Usage: scripts/demo-summary.py OUT_DIR"""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
demo = json.loads((out / "demo-report.json").read_text())
print("\n== kvtier demo: summary ==")
tiers = ", ".join(f"{n} from {t.replace('TIER_', '').lower()}" for t, n in sorted(demo["blocks_read_by_tier"].items()))
print(f"Conversation workload: {demo['conversations']} conversations x {demo['turns']} turns, "
      f"{demo['block_bytes']:,}-byte blocks, {demo['wall_s']:.1f} s.")
print(f"  {demo['blocks_hit']} prefix blocks served from kvtier (hit rate {demo['hit_rate']:.0%}; "
      f"read {tiers or 'none'}), {demo['blocks_missed']} computed and written back.")
for op in ("lookup", "read", "write"):
    j = demo[op]
    print(f"  {op:6} client p50 {j['client_ms']['p50']:7.2f} ms  p99 {j['client_ms']['p99']:7.2f} ms   "
          f"(server p50 {j['server_ms']['p50']:.2f} ms)")
rec_path = out / "bench" / "record.json"
if rec_path.exists():
    rec = json.loads(rec_path.read_text())
    print(f"\nBench: {rec['workload']} workload, {rec['value_size']:,}-byte values, closed loop "
          "(ops/s and end-to-end p50 / p99 per operation):")
    for step in rec["steps"]:
        mode = step["mode"]
        conc = (f"c={mode['concurrency'] * step.get('processes', 1)}" if mode["kind"] == "closed"
                else f"{mode.get('rate_per_s', 0):.0f}/s")
        parts = []
        for op, st in sorted(step["ops"].items()):
            e2e = st["latency_us"].get("e2e", {})
            parts.append(f"{op} {st['throughput_ops_s']:7.0f}/s {e2e.get('p50', 0) / 1000:6.2f}/{e2e.get('p99', 0) / 1000:6.2f} ms")
        flags = " [flagged: " + ", ".join(f["kind"] for f in step["flags"]) + "]" if step.get("flags") else ""
        print(f"  {conc:<6} " + "   ".join(parts) + flags)
print("\nWritten:")
for rel, what in [
    ("demo-report.md", "the workload report (Markdown)"),
    ("demo-report.json", "the same as JSON"),
    ("metrics.txt", "a /metrics snapshot"),
    ("server.log", "the server's log"),
    ("bench.log", "the bench's console output"),
    ("bench/report.html", "charts and tables: open it in a browser"),
    ("bench/summary.md", "the bench summary (Markdown)"),
    ("bench/record.json", "the bench perf record"),
]:
    p = out / rel
    if p.exists():
        print(f"  {p}  {what}")
