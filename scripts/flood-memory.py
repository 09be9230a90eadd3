#!/usr/bin/env python3
"""What holds the memory in the gRPC write flood (notes/014).

notes/012 measured the server's RSS at 1.69x its 512 MiB memory tier under 32
closed-loop gRPC writers of 1.2 MB blocks and blamed HTTP/2 flow-control
windows. This script tests that and the allocator alternative, one factor at
a time, each on a fresh `kvtier serve` with a 512 MiB memory tier:

* HTTP/2 windows: the default (stream 32 MiB / connection 64 MiB) vs 4/8 and
  2/4 MiB (`[server] stream_window`, `connection_window`);
* writers: 32 (the flood) and 1 (no two requests' windows at once);
* jemalloc's page decay: the default vs `dirty_decay_ms:0,muzzy_decay_ms:0`
  (freed pages go back to the kernel at once; set through `_RJEM_MALLOC_CONF`,
  tikv-jemallocator's prefixed MALLOC_CONF).

Each row: answered writes/s, p99, the server's peak RSS (sampled every 20 ms)
and RSS / memory tier. Writes go over gRPC (`--transport grpc`) for 4 s after
a 1 s warm-up.

usage: python3 scripts/flood-memory.py [--kvtier target/release/kvtier]
       [--out notes/014-grpc-flood-memory.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path

from _perf import ROOT

from perf import Sampler, header, versions, write_record
from perf.services import kvtier_server

_spec = importlib.util.spec_from_file_location("overload_knee", ROOT / "scripts/overload-knee.py")
assert _spec is not None and _spec.loader is not None
ok = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ok)

BUDGET_MIB = 512
WINDOWS = {
    "32/64 MiB (default)": "",
    "4/8 MiB": '[server]\nstream_window = "4MiB"\nconnection_window = "8MiB"\n',
    "2/4 MiB": '[server]\nstream_window = "2MiB"\nconnection_window = "4MiB"\n',
}
DECAY = {"default": None, "no decay": "dirty_decay_ms:0,muzzy_decay_ms:0"}


def one(binary: Path, windows: str, decay: str, writers: int) -> dict:
    d = Path(tempfile.mkdtemp(prefix="kvtier-flood-"))
    srv = kvtier_server(binary, ["--memory-capacity", f"{BUDGET_MIB}MiB"], config=WINDOWS[windows],
                        env={"_RJEM_MALLOC_CONF": DECAY[decay]})
    try:
        with Sampler(srv.pid, 0.02) as rss:
            rec = ok.bench(binary, srv, d / "bench", [
                "--workload", "write", "--concurrency", str(writers), "--transport", "grpc",
                "--duration", "4s", "--warmup", "1s"])
        peak = rss.rss_peak
        s = ok.step_summary(rec["steps"][0], "write")
        return {
            "windows": windows, "jemalloc_decay": decay, "writers": writers,
            "answered_writes_s": s["admitted_ops_s_median"], "p99_ms": s["p99_ms_median"],
            "errors": s["errors"],
            "rss_idle_mib": rss.rss_before, "rss_peak_mib": peak, "rss_over_budget": peak / BUDGET_MIB,
            "within_budget_plus_10pct_plus_idle": peak <= BUDGET_MIB * 1.10 + rss.rss_before,
            "command": rec["_cmd"],
        }
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvtier", default=str(ROOT / "target/release/kvtier"))
    ap.add_argument("--out", default=str(ROOT / "notes/014-grpc-flood-memory.json"))
    a = ap.parse_args()
    binary = Path(a.kvtier)
    head = header(versions=versions("kvtier", paths={"kvtier": binary}))
    rows = []
    for windows in WINDOWS:
        for writers in (32, 1):
            rows.append(one(binary, windows, "default", writers))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "command"}), flush=True)
    for writers in (32, 1):
        rows.append(one(binary, "32/64 MiB (default)", "no decay", writers))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "command"}), flush=True)
    write_record(a.out, {"memory_budget_mib": BUDGET_MIB, "rows": rows}, head)


if __name__ == "__main__":
    main()
