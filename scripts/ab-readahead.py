#!/usr/bin/env python3
"""A/B of two kvtier binaries on a 3-node cluster's long prefix reads
(notes/022-read-ahead): the `prefix-read` workload (one lookup + one read of
a 256-block prefix) through one node's address, where about a third of the
blocks come from the other nodes, and through the node list, where none do.

Runs scripts/bench-cluster.py for A and B in perf.ab's alternating order
(A B, B A, ...: drift on this shared machine hits both), then compares the
medians over each binary's repeats (perf.ab.ratio: repeats outside
0.75-1.33x their median are listed). Writes OUT/record.json and
OUT/summary.md. It stays a script because `kvtier bench ab` starts one
server per side, not a cluster (docs/bench-ab.md).

  scripts/ab-readahead.py --a /tmp/kvtier-base --b target/release/kvtier --out out/ab-readahead
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _perf import ROOT

from perf import alternate, header, ratio, versions, write_record


def run(binary: str, out: Path, a) -> dict:
    cmd = [sys.executable, str(ROOT / "scripts" / "bench-cluster.py"), "--kvtier", binary, "--nodes", "3",
           "--workloads", "prefix-read", "--concurrency", "1", "--duration", a.duration, "--warmup", "1s",
           "--repeat", str(a.repeat), "--value-size", a.value_size, "--memory", "1GiB", "--skip-failover",
           "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "record.json").read_text())


def samples(rec: dict, path: str) -> dict:
    """Per-repeat throughput (reads/s) and the step's p99 of one path."""
    (e,) = [e for e in rec["scaling"] if e["path"] == path]
    (s,) = e["steps"]
    return {"ops_s": s["ops_s"], "ops_s_min": s["ops_s_min"], "ops_s_max": s["ops_s_max"], "p99_ms": s["p99_ms"],
            "errors": s["errors"], "flags": s["flags"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="baseline kvtier binary")
    ap.add_argument("--b", required=True, help="changed kvtier binary")
    ap.add_argument("--a-commit", default="", help="the commit A was built from")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", default="6s")
    ap.add_argument("--value-size", default="1.2MB")
    ap.add_argument("--out", default="out/ab-readahead")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    head = header(versions={**versions(), "kvtier (A)": versions("kvtier", paths={"kvtier": a.a})["kvtier"],
                            "kvtier (B)": versions("kvtier", paths={"kvtier": a.b})["kvtier"]})
    binaries = {"A": a.a, "B": a.b}

    def one(label: str, r: int) -> dict:
        rec = run(binaries[label], out / f"{label}{r}", a)
        x: dict[str, Any] = {"binary": label, "round": r, "single": samples(rec, "single"),
                             "direct": samples(rec, "direct")}
        print(f"{label}{r}: single {x['single']['ops_s']:.3f}/s direct {x['direct']['ops_s']:.3f}/s", flush=True)
        return x

    by = alternate(["A", "B"], a.rounds, one)
    runs = sorted(by["A"] + by["B"], key=lambda x: (x["round"], x["binary"]))
    result = {}
    for path in ("single", "direct"):
        ops = ratio([x[path]["ops_s"] for x in by["A"]], [x[path]["ops_s"] for x in by["B"]])
        p99 = {lab: statistics.median(x[path]["p99_ms"] for x in by[lab]) for lab in ("A", "B")}
        med = {"A": ops["base"]["median"], "B": ops["head"]["median"]}
        result[path] = {"median_reads_s": med, "median_p99_ms": p99, "b_over_a": ops["ratio"],
                        "p99_b_over_a": p99["B"] / p99["A"],
                        "outliers": {"A": ops["base"]["outliers"], "B": ops["head"]["outliers"]}}
    write_record(out / "record.json", {
        "a_commit": a.a_commit,
        "method": (__doc__ or "").split("\n\n")[0].replace("\n", " "),
        "value_size": a.value_size,
        "blocks_per_read": 256,
        "runs": runs,
        "result": result,
    }, head)
    lines = ["| path | A reads/s | B reads/s | B/A | A p99 ms | B p99 ms |", "|---|---|---|---|---|---|"]
    for path, x in result.items():
        lines.append(f"| {path} | {x['median_reads_s']['A']:.3f} | {x['median_reads_s']['B']:.3f} | "
                     f"{x['b_over_a']:.2f} | {x['median_p99_ms']['A']:.0f} | {x['median_p99_ms']['B']:.0f} |")
    lines += ["", "| run | single reads/s (min–max) | direct reads/s (min–max) |", "|---|---|---|"]
    for x in runs:
        lines.append(f"| {x['binary']}{x['round']} | {x['single']['ops_s']:.3f} ({x['single']['ops_s_min']:.3f}–"
                     f"{x['single']['ops_s_max']:.3f}) | {x['direct']['ops_s']:.3f} ({x['direct']['ops_s_min']:.3f}–"
                     f"{x['direct']['ops_s_max']:.3f}) |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
