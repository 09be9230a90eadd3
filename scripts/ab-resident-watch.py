#!/usr/bin/env python3
"""The resident-limit watcher, before and after it watched the process's RSS
(notes/033; the bound it keeps: docs/operations.md, "Memory").

Before: the watcher (crates/kvtier/src/purge.rs) compared jemalloc's
`stats.resident` with `server.resident_limit` and purged freed pages above
it. The documented bound is on the process's RSS, which also holds the
binary's pages, stacks and everything not from jemalloc, and the watcher
acts only every 20 ms, so RSS could sit above the line. After: it reads
VmRSS and purges from 32 MiB below the line.

Same machine, same run, variants alternating within each repeat, fresh
`kvtier serve` per run:

* flood: 32 closed-loop writers of 1.2 MB blocks for 4 s after a 1 s
  warm-up, over gRPC and over the data plane, memory tiers of 128 and
  512 MiB; the server's peak RSS (sampled every 20 ms), answered writes/s;
  the line is the default resident_limit, tier x 1.1 + request_memory
  (max(tier/4, 64 MiB)) + 64 MiB;
* c=1: one writer over the data plane on a filled 256 MiB tier (every write
  evicts), 4 s: what freed-page reuse buys (notes/025), which purging costs.

  cargo build --release -p kvtier
  python3 scripts/ab-resident-watch.py --base /tmp/base/kvtier-527f9cc \\
      --repeat 3 --out notes/033-resident-watch.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from _perf import ROOT

from perf import Sampler, header, rss_mib, versions, write_record
from perf.services import Server, kvtier_server

SIZE = 1258291



def line_mib(tier: int) -> float:
    return tier * 1.1 + max(tier / 4, 64) + 64


def bench(binary: Path, server: Server, out: Path, transport: str, conc: int, duration: str,
          warmup: str) -> dict:
    subprocess.run([str(binary), "bench", "--target", server.grpc, "--workload", "write",
                    "--value-size", str(SIZE), "--concurrency", str(conc), "--transport", transport,
                    "--duration", duration, "--warmup", warmup, "--quiet", "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    o = json.loads((out / "record.json").read_text())["steps"][0]["ops"]["write"]
    return {"writes_s": o["throughput_ops_s"], "p99_us": o["latency_us"]["e2e"]["p99"], "errors": o["errors"]}


def flood(binary: Path, tier: int, transport: str) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="kvtier-rw-"))
    server = kvtier_server(binary, ["--memory-capacity", f"{tier}MiB"])
    try:
        with Sampler(server.pid, 0.02) as rss:
            r = bench(binary, server, tmp / "b", transport, 32, "4s", "1s")
    finally:
        server.stop()
    return {**r, "rss_peak_mib": round(rss.rss_peak, 1), "line_mib": line_mib(tier),
            "within_line": rss.rss_peak <= line_mib(tier)}


def single(binary: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="kvtier-rw-"))
    server = kvtier_server(binary, ["--memory-capacity", "256MiB"])
    try:
        bench(binary, server, tmp / "fill", "data-plane", 1, "1s", "100ms")  # every later write evicts
        r = bench(binary, server, tmp / "b", "data-plane", 1, "4s", "500ms")
        return {**r, "rss_after_mib": round(rss_mib(server.pid), 1)}
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="kvtier binary with the old watcher")
    ap.add_argument("--kvtier", default=str(ROOT / "target/release/kvtier"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "notes/033-resident-watch.json"))
    a = ap.parse_args()
    head = header(versions=versions("kvtier", paths={"kvtier": a.kvtier}))
    variants = {"before": Path(a.base), "after": Path(a.kvtier)}
    rows = []
    for rep in range(1, a.repeat + 1):
        for tier in (128, 512):
            for transport in ("grpc", "data-plane"):
                for label, binary in variants.items():
                    row = {"case": f"flood {transport} {tier} MiB", "variant": label, "repeat": rep,
                           **flood(binary, tier, transport)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        for label, binary in variants.items():
            row = {"case": "c=1 data-plane 256 MiB", "variant": label, "repeat": rep, **single(binary)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = {}
    for case in dict.fromkeys(r["case"] for r in rows):
        s = {}
        for label in variants:
            rs = [r for r in rows if r["case"] == case and r["variant"] == label]
            s[label] = {"writes_s_median": statistics.median(r["writes_s"] for r in rs),
                        "writes_s_repeats": [r["writes_s"] for r in rs]}
            if "rss_peak_mib" in rs[0]:
                s[label] |= {"rss_peak_mib_median": statistics.median(r["rss_peak_mib"] for r in rs),
                             "rss_peak_mib_max": max(r["rss_peak_mib"] for r in rs),
                             "line_mib": rs[0]["line_mib"],
                             "repeats_within_line": sum(r["within_line"] for r in rs)}
        s["writes_s_ratio_after_before"] = round(s["after"]["writes_s_median"] / s["before"]["writes_s_median"], 3)
        summary[case] = s
    write_record(a.out, {
        "title": "Resident-limit watcher: jemalloc resident at the line (before) vs process RSS from 32 MiB below it "
                 "(after)",
        "binaries": {k: str(v) for k, v in variants.items()},
        "summary": summary,
        "rows": rows,
    }, head)


if __name__ == "__main__":
    main()
