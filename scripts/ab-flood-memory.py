#!/usr/bin/env python3
"""The write flood's memory, before and after (notes/024).

notes/014 left the gRPC write flood at 1.5-1.6x a 512 MiB memory tier. This
A/B runs the same flood (32 closed-loop writers of 1.2 MB blocks, 4 s after a
1 s warm-up, fresh `kvtier serve --memory-capacity 512MiB` per run) on:

* `base`: a binary built from the commit before the change (`--base`);
* `copy`: this tree's binary with the allocator watcher off
  (`server.resident_limit` = 1 TiB): gRPC blocks keep exact-size copies
  instead of slices of tonic's receive buffer;
* `copy+limit`: this tree's binary with its defaults (the watcher purges
  freed pages while resident memory is above memory tier + 10 % +
  request_memory + 64 MiB = 755 MiB here).

over gRPC and over the data plane, alternating variants within each repeat.
Each run: answered writes/s, p99, the server's peak RSS (sampled every 20 ms)
and RSS / memory tier. The target (docs/operations.md, "Memory"): RSS within the memory tier
+ 10 % + a fixed overhead; the overhead kvtier documents is request_memory
(bytes of requests being received, 128 MiB here) + 64 MiB.

  python3 scripts/ab-flood-memory.py --base /tmp/base/target/release/kvtier \\
      --repeat 3 --out notes/024-flood-memory.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
from pathlib import Path

from _perf import ROOT

from perf import Sampler, header, tool_version, versions, write_record
from perf.services import kvtier_server

_spec = importlib.util.spec_from_file_location("overload_knee", ROOT / "scripts/overload-knee.py")
assert _spec is not None and _spec.loader is not None
ok = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ok)

TIER_MIB = 512
REQUEST_MIB = 128  # request_memory's default: a quarter of the tier
LINE_MIB = TIER_MIB * 1.1 + REQUEST_MIB + 64


def one(binary: Path, variant: str, transport: str) -> dict:
    d = Path(tempfile.mkdtemp(prefix="kvtier-flood-"))
    srv = kvtier_server(binary, ["--memory-capacity", f"{TIER_MIB}MiB"],
                        config='[server]\nresident_limit = "1TiB"\n' if variant == "copy" else "")
    try:
        with Sampler(srv.pid, 0.02) as rss:
            rec = ok.bench(binary, srv, d / "bench", [
                "--workload", "write", "--concurrency", "32", "--transport", transport,
                "--duration", "4s", "--warmup", "1s"])
        peak = rss.rss_peak
        s = ok.step_summary(rec["steps"][0], "write")
        return {
            "variant": variant, "transport": transport,
            "answered_writes_s": s["admitted_ops_s_median"], "p99_ms": s["p99_ms_median"], "errors": s["errors"],
            "rss_idle_mib": rss.rss_before, "rss_peak_mib": peak, "rss_over_tier": peak / TIER_MIB,
            "within_line": peak <= LINE_MIB + rss.rss_before,
            "command": rec["_cmd"],
        }
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="kvtier binary built from the commit before the change")
    ap.add_argument("--kvtier", default=str(ROOT / "target/release/kvtier"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "notes/024-flood-memory.json"))
    a = ap.parse_args()
    bins = {"base": Path(a.base), "copy": Path(a.kvtier), "copy+limit": Path(a.kvtier)}
    head = header(versions=versions("kvtier", paths={"kvtier": a.kvtier}))
    runs = []
    for rep in range(a.repeat):
        for transport in ("grpc", "data-plane"):
            for variant, binary in bins.items():
                r = one(binary, variant, transport)
                r["repeat"] = rep
                runs.append(r)
                print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()
                                  if k != "command"}), flush=True)
    rows = []
    for transport in ("grpc", "data-plane"):
        for variant in bins:
            rs = [r for r in runs if r["transport"] == transport and r["variant"] == variant]
            rows.append({
                "transport": transport, "variant": variant,
                "rss_peak_mib_per_repeat": [r["rss_peak_mib"] for r in rs],
                "rss_peak_mib": statistics.median(r["rss_peak_mib"] for r in rs),
                "rss_over_tier": statistics.median(r["rss_over_tier"] for r in rs),
                "answered_writes_s": statistics.median(r["answered_writes_s"] for r in rs),
                "p99_ms": statistics.median(r["p99_ms"] for r in rs),
                "errors": sum(r["errors"] for r in rs),
                "all_within_line": all(r["within_line"] for r in rs),
            })
    write_record(a.out, {
        "base_binary": {"path": a.base, "version": f"kvtier {tool_version('kvtier', a.base)}"},
        "memory_tier_mib": TIER_MIB, "request_memory_mib": REQUEST_MIB, "line_mib": LINE_MIB,
        "rows": rows, "runs": runs,
    }, head)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
