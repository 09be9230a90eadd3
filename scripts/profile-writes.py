#!/usr/bin/env python3
"""Where a kvtier server spends 1.2 MB writes at c=1, by allocator setting
(notes/016, notes/025): `perf record` on the server process during a `kvtier bench`
write run over the data plane, with jemalloc's default page decay and with
decay off (freed pages are never handed back to the kernel), both set at run
time through `_RJEM_MALLOC_CONF` so any build measures the same thing, and
as shipped (no `_RJEM_MALLOC_CONF`: what the binary compiled in).
The same settings are then run through the 32-writer flood of
notes/012/014 (512 MiB tier, data plane and gRPC) for the memory side,
against docs/operations.md's resident line.

Each repeat starts a fresh `kvtier serve` (256 MiB memory tier), fills the
tier first (1 s of writes: steady state, every write evicts), then profiles
the server for the measured run. Repeats alternate between the settings.
Reported per repeat: answered writes/s, p50, p99 and the share of server
samples in page faults and zeroing, the kernel's socket copy, and CRC32C.

usage: python3 scripts/profile-writes.py [--kvtier target/release/kvtier]
       [--repeat 3] [--duration 4] [--flood-repeat 1] [--out notes/016-allocator-decay.json]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

from _perf import ROOT

from perf import Sampler, header, versions, write_record
from perf.services import Server, kvtier_server

SETTINGS = {
    # jemalloc 5.3's defaults (what kvtier shipped with until notes/025).
    "jemalloc default decay": "dirty_decay_ms:10000,muzzy_decay_ms:0",
    "no purge": "dirty_decay_ms:-1,muzzy_decay_ms:-1",
    # No _RJEM_MALLOC_CONF: whatever the binary compiled in (since notes/025,
    # decay off with server.resident_limit as the bound).
    "as shipped": None,
}
CATEGORIES = {
    "page faults and zeroing": re.compile(
        r"clear_page|exc_page_fault|page_fault|do_anonymous_page|handle_mm_fault|unmap_page_range|"
        r"alloc_pages|alloc_frozen_pages|rmqueue|folio|memcg|lruvec|mt_find|zap_|free_pages|free_unref"),
    "kernel socket copy": re.compile(r"_copy_to_iter|_copy_from_iter|copy_user"),
    "crc32c": re.compile(r"crc32c|crc_u64"),
}


def start_server(binary: Path, conf: str | None, memory: str = "256MiB") -> Server:
    """A fresh server with `conf` as its _RJEM_MALLOC_CONF (None: the compiled-in setting)."""
    return kvtier_server(binary, ["--memory-capacity", memory], env={"_RJEM_MALLOC_CONF": conf})


def bench(binary: Path, grpc: str, out: Path, duration: float, warmup: float) -> dict:
    subprocess.run([str(binary), "bench", "--target", f"grpc://{grpc}", "--workload", "write",
                    "--value-size", "1258291", "--concurrency", "1", "--duration", f"{duration}s",
                    "--warmup", f"{warmup}s", "--quiet", "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((out / "record.json").read_text())


def shares(perf_data: Path) -> dict:
    rep = subprocess.run(["perf", "report", "-i", str(perf_data), "--no-children", "--sort", "symbol",
                          "--stdio", "-g", "none"], capture_output=True, text=True).stdout
    out = {k: 0.0 for k in CATEGORIES}
    top: list[dict] = []
    for line in rep.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[[.k]\]\s+(\S+)", line)
        if not m:
            continue
        pct, sym = float(m.group(1)), m.group(2)
        if len(top) < 8:
            top.append({"symbol": sym, "percent": pct})
        for k, rx in CATEGORIES.items():
            if rx.search(sym):
                out[k] += pct
                break
    return {"categories_percent": out, "top": top}


def one(binary: Path, label: str, conf: str | None, duration: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="kvtier-prof-"))
    srv = start_server(binary, conf)
    grpc = srv.grpc
    try:
        bench(binary, grpc, tmp / "fill", 1.0, 0.1)  # fill the tier: every later write evicts
        perf = subprocess.Popen(["perf", "record", "-F", "999", "-g", "-p", str(srv.pid), "-o",
                                 str(tmp / "perf.data"), "--", "sleep", str(duration + 1.5)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rec = bench(binary, grpc, tmp / "bench", duration, 0.5)
        perf.wait()
        o = rec["steps"][0]["ops"]["write"]
        return {"setting": label, "malloc_conf": conf,
                "writes_s": o["throughput_ops_s"], "p50_us": o["latency_us"]["e2e"]["p50"],
                "p99_us": o["latency_us"]["e2e"]["p99"], "errors": o["errors"], **shares(tmp / "perf.data")}
    finally:
        srv.stop()


TIER_MIB = 512
# docs/operations.md's bound, the default server.resident_limit: the memory
# tier + 10 % + request_memory (¼ of the tier, at least 64 MiB) + 64 MiB.
RESIDENT_LINE_MIB = TIER_MIB * 1.10 + max(TIER_MIB / 4, 64) + 64


def flood(binary: Path, label: str, conf: str | None, transport: str) -> dict:
    """32 writers of 1.2 MB for 4 s against a 512 MiB tier; the server's peak RSS (sampled every 20 ms)."""
    tmp = Path(tempfile.mkdtemp(prefix="kvtier-flood-"))
    srv = start_server(binary, conf, f"{TIER_MIB}MiB")
    try:
        with Sampler(srv.pid, 0.02) as rss:
            subprocess.run([str(binary), "bench", "--target", f"grpc://{srv.grpc}", "--workload", "write",
                            "--value-size", "1258291", "--concurrency", "32", "--transport", transport,
                            "--duration", "4s", "--warmup", "1s", "--quiet", "--out", str(tmp / "b")],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rec = json.loads((tmp / "b" / "record.json").read_text())
    finally:
        srv.stop()
    idle, peak = rss.rss_before, rss.rss_peak
    o = rec["steps"][0]["ops"]["write"]
    return {"setting": label, "transport": transport, "writes_s": o["throughput_ops_s"],
            "rss_idle_mib": idle, "rss_peak_mib": peak, "rss_over_budget": peak / TIER_MIB,
            "resident_line_mib": RESIDENT_LINE_MIB, "within_resident_line": peak <= RESIDENT_LINE_MIB}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvtier", default=str(ROOT / "target/release/kvtier"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--flood-repeat", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "notes/016-allocator-decay.json"))
    a = ap.parse_args()
    head = header(versions=versions("kvtier", "perf", paths={"kvtier": a.kvtier}))
    rows = []
    for r in range(a.repeat):
        for label, conf in SETTINGS.items():
            row = one(Path(a.kvtier), label, conf, a.duration)
            row["repeat"] = r + 1
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("setting", "repeat", "writes_s", "p99_us", "categories_percent")}),
                  flush=True)
    summary = {}
    for label in SETTINGS:
        rs = [x for x in rows if x["setting"] == label]
        summary[label] = {
            "writes_s_median": statistics.median(x["writes_s"] for x in rs),
            "p99_us_median": statistics.median(x["p99_us"] for x in rs),
            "categories_percent_median": {k: statistics.median(x["categories_percent"][k] for x in rs)
                                          for k in CATEGORIES},
        }
    floods = []
    for r in range(a.flood_repeat):
        for transport in ("data-plane", "grpc"):
            for label, conf in SETTINGS.items():
                floods.append({**flood(Path(a.kvtier), label, conf, transport), "repeat": r + 1})
                print(json.dumps(floods[-1]), flush=True)
    flood_summary = {
        f"{t} / {label}": {
            "rss_peak_mib_median": statistics.median(f["rss_peak_mib"] for f in fs),
            "rss_peak_mib_max": max(f["rss_peak_mib"] for f in fs),
            "writes_s_median": statistics.median(f["writes_s"] for f in fs),
            "all_within_resident_line": all(f["within_resident_line"] for f in fs),
        }
        for t in ("data-plane", "grpc") for label in SETTINGS
        for fs in [[f for f in floods if f["transport"] == t and f["setting"] == label]]
    }
    base, new, shipped = (summary[k]["writes_s_median"] for k in SETTINGS)
    write_record(a.out, {
        "rows": rows,
        "summary": summary,
        "writes_ratio_no_purge_over_default": new / base if base else None,
        "writes_ratio_shipped_over_default": shipped / base if base else None,
        "flood_32_writers": floods,
        "flood_summary": flood_summary,
    }, head)
    print(json.dumps(summary, indent=1))
    print(json.dumps(flood_summary, indent=1))


if __name__ == "__main__":
    main()
