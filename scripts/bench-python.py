#!/usr/bin/env python3
"""Reproduces notes/008-python-data-plane: the Python SDK's 1.2 MB reads and
writes over the bulk data plane vs over gRPC, same server, same run.

Fairness:
  * One release ``kvtier serve`` (memory tier; default config otherwise) pinned
    to core 1, the Python load generator to core 0 (both modes share the core
    split, so the comparison is like for like).
  * Both modes use the same ``kvtier.Client`` API and pool size
    (``connections`` = concurrency); only ``data_plane`` differs.
  * Repeats alternate the modes (grpc, wire, grpc, wire, ...) so drift on a
    shared machine hits both; medians over the repeats are reported.
  * Reads pick uniformly among 64 preloaded blocks (memory hits); writes store
    a new key each time (the memory tier evicts once full), as the Rust bench does.
  * Latency is the client's end-to-end time of ``read`` / ``write`` (payload
    checksums included), per call.
  * Reference: after each Python pair, ``kvtier bench`` (the Rust client, data
    plane) runs the same workload and concurrency against the same server on
    the same core, so "how far is Python from Rust" is measured in the same run.

Usage: .venv/bin/python scripts/bench-python.py [--out out/008-python-data-plane]
       [--duration 5] [--warmup 1] [--concurrency 1,8] [--size 1200000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from _perf import ROOT as REPO

from kvtier import Block, Client
from kvtier._crc import ACCELERATED
from perf import header, versions, write_record
from perf.services import kvtier_server

PRELOAD = 64


def percentile(sorted_us: list[float], q: float) -> float:
    if not sorted_us:
        return float("nan")
    i = min(len(sorted_us) - 1, max(0, int(round(q * (len(sorted_us) - 1)))))
    return sorted_us[i]


def run_step(target: str, mode: str, workload: str, conc: int, size: int, duration: float, warmup: float,
             payloads: list[bytes], read_keys: list[bytes], seq: list[int]) -> dict:
    """One measured step: ``conc`` threads calling ``workload`` for ``duration`` seconds."""
    c = Client(target, connections=conc, timeout=30, data_plane=(mode == "wire"))
    try:
        if (c.data_plane() is not None) != (mode == "wire"):
            raise SystemExit(f"mode {mode}: the data plane is {'on' if c.data_plane() else 'off'}")
        lat: list[list[float]] = [[] for _ in range(conc)]
        errors: list[BaseException] = []
        start = time.monotonic()
        measure_from = start + warmup
        stop_at = measure_from + duration
        counter_lock = threading.Lock()

        def worker(w: int) -> None:
            import random

            rng = random.Random(w)
            mine = lat[w]
            try:
                while True:
                    t0 = time.monotonic()
                    if t0 >= stop_at:
                        return
                    if workload == "read":
                        k = read_keys[rng.randrange(len(read_keys))]
                        r = c.read("bench", [k])
                        if len(r.blocks) != 1:
                            raise RuntimeError(f"read of a preloaded block returned {len(r.blocks)} blocks")
                    else:
                        with counter_lock:
                            seq[0] += 1
                            n = seq[0]
                        c.write("bench", [Block(b"w%016d" % n, payloads[n % len(payloads)])])
                    t1 = time.monotonic()
                    if t0 >= measure_from:
                        mine.append((t1 - t0) * 1e6)
            except BaseException as e:  # noqa: BLE001 - reported by the caller
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(conc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        us = sorted(x for per_worker in lat for x in per_worker)
        ops = len(us) / duration
        return {
            "mode": mode,
            "workload": workload,
            "concurrency": conc,
            "ops": len(us),
            "ops_per_s": round(ops, 1),
            "gbit_per_s": round(ops * size * 8 / 1e9, 3),
            "p50_us": round(percentile(us, 0.50), 1),
            "p99_us": round(percentile(us, 0.99), 1),
            "mean_us": round(statistics.fmean(us), 1) if us else None,
        }
    finally:
        c.close()


def run_rust(binary: Path, target: str, workload: str, conc: int, size: int, duration: float, warmup: float,
             out: Path, gen_cpu: int | None) -> dict:
    """The same step with the Rust client (``kvtier bench``), for reference."""
    d = out / f"rust-{workload}-c{conc}-{int(time.time() * 1000)}"
    cmd = [
        str(binary), "bench", "--target", f"grpc://{target}", "--workload", workload,
        "--value-size", str(size), "--concurrency", str(conc), "--duration", f"{duration}s",
        "--warmup", f"{warmup}s", "--repeat", "1", "--quiet", "--out", str(d),
    ]
    if gen_cpu is not None:
        cmd = ["taskset", "-c", str(gen_cpu), *cmd]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rec = json.loads((d / "record.json").read_text())
    ops = rec["steps"][0]["ops"][workload]
    e2e = ops["latency_us"]["e2e"]
    return {
        "mode": "rust",
        "workload": workload,
        "concurrency": conc,
        "ops": ops["ops"],
        "ops_per_s": round(ops["throughput_ops_s"], 1),
        "gbit_per_s": round(ops["throughput_ops_s"] * size * 8 / 1e9, 3),
        "p50_us": e2e["p50"],
        "p99_us": e2e["p99"],
        "mean_us": round(e2e["mean"], 1),
    }


def _crc32c_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("crc32c")
    except PackageNotFoundError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "out" / "008-python-data-plane"))
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--size", type=int, default=1_200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "kvtier"))
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--gen-cpu", type=int, default=0)
    ap.add_argument("--no-rust-reference", dest="rust_reference", action="store_false",
                    help="skip the kvtier bench (Rust client) reference runs")
    a = ap.parse_args()
    if not ACCELERATED:
        raise SystemExit("the crc32c package is missing: checksums would be pure Python (pip install crc32c)")
    binary = Path(a.binary)
    if not binary.is_file():
        subprocess.run(["cargo", "build", "--release", "-p", "kvtier"], cwd=REPO, check=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    concs = [int(x) for x in a.concurrency.split(",")]
    pin = hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > max(a.server_cpu, a.gen_cpu)

    head = header(versions=versions("kvtier", paths={"kvtier": binary}, known={"crc32c": _crc32c_version()}))
    # The server is started on its core (its runtime sizes itself to the CPUs
    # it may use at start), then the generator moves to its own core.
    server = kvtier_server(binary, cpus=[a.server_cpu] if pin else None)
    if pin:
        os.sched_setaffinity(0, {a.gen_cpu})
    steps = []
    try:
        payloads = [os.urandom(a.size) for _ in range(8)]
        read_keys = [b"r%04d" % i for i in range(PRELOAD)]
        with Client(server.grpc, connections=1) as c:
            for i, k in enumerate(read_keys):
                c.write("bench", [Block(k, payloads[i % len(payloads)])])
        seq = [0]
        for workload in ("read", "write"):
            for conc in concs:
                for rep in range(a.repeat):
                    for mode in ("grpc", "wire"):
                        s = run_step(server.grpc, mode, workload, conc, a.size, a.duration, a.warmup,
                                     payloads, read_keys, seq)
                        s["repeat"] = rep
                        steps.append(s)
                        print(f"{workload:5} c={conc:<2} {mode:4} rep {rep}: {s['ops_per_s']:8.1f} ops/s  "
                              f"p50 {s['p50_us']:8.0f} us  p99 {s['p99_us']:8.0f} us", flush=True)
                    if a.rust_reference:
                        s = run_rust(binary, server.grpc, workload, conc, a.size, a.duration, a.warmup, out,
                                     a.gen_cpu if pin else None)
                        s["repeat"] = rep
                        steps.append(s)
                        print(f"{workload:5} c={conc:<2} rust rep {rep}: {s['ops_per_s']:8.1f} ops/s  "
                              f"p50 {s['p50_us']:8.0f} us  p99 {s['p99_us']:8.0f} us", flush=True)
        with Client(server.grpc, connections=1) as c:
            tiers = [t.tier.name.lower() for t in c.stats().tiers]
    finally:
        rc = server.stop()

    summary: list[dict[str, Any]] = []
    for workload in ("read", "write"):
        for conc in concs:
            row: dict[str, Any] = {"workload": workload, "concurrency": conc}
            for mode in ("grpc", "wire", "rust"):
                sel = [s for s in steps if (s["workload"], s["concurrency"], s["mode"]) == (workload, conc, mode)]
                if not sel:
                    continue
                row[mode] = {
                    k: statistics.median(s[k] for s in sel) for k in ("ops_per_s", "gbit_per_s", "p50_us", "p99_us")
                }
            # Per-repeat ratios (each pair measured back to back), then their median.
            pairs = [
                (w["ops_per_s"] / g["ops_per_s"])
                for g, w in zip(
                    [s for s in steps if (s["workload"], s["concurrency"], s["mode"]) == (workload, conc, "grpc")],
                    [s for s in steps if (s["workload"], s["concurrency"], s["mode"]) == (workload, conc, "wire")],
                )
            ]
            row["wire_over_grpc_ops"] = round(statistics.median(pairs), 2)
            row["wire_over_grpc_ops_range"] = [round(min(pairs), 2), round(max(pairs), 2)]
            row["wire_p99_over_grpc_p99"] = round(row["wire"]["p99_us"] / row["grpc"]["p99_us"], 2)
            if "rust" in row:
                row["python_wire_over_rust_ops"] = round(row["wire"]["ops_per_s"] / row["rust"]["ops_per_s"], 2)
            summary.append(row)
    write_record(out / "record.json", {
        "config": {
            "duration_s": a.duration,
            "warmup_s": a.warmup,
            "size_bytes": a.size,
            "repeat": a.repeat,
            "concurrency": concs,
            "pinned": bool(pin),
            "server_cpu": a.server_cpu,
            "generator_cpu": a.gen_cpu,
            "server_exit_code": rc,
            "server_tiers": tiers,
        },
        "results": {"summary": summary, "steps": steps},
    }, head)
    for row in summary:
        print(f"{row['workload']:5} c={row['concurrency']:<2} grpc {row['grpc']['ops_per_s']:8.1f}/s  "
              f"wire {row['wire']['ops_per_s']:8.1f}/s  ratio {row['wire_over_grpc_ops']}x "
              f"{row['wire_over_grpc_ops_range']}  p99 {row['grpc']['p99_us']:.0f} -> {row['wire']['p99_us']:.0f} us"
              + (f"  rust {row['rust']['ops_per_s']:8.1f}/s (python/rust {row['python_wire_over_rust_ops']}x)"
                 if "rust" in row else ""))


if __name__ == "__main__":
    main()
