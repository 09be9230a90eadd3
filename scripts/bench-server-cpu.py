#!/usr/bin/env python3
"""What each server spends per 1.2 MB read and write: kvtier, Redis and
Mooncake Store at c = 1, 8, 32, in server CPU time per operation, a unit
that does not depend on how fast the load generator is (notes/046).

On this 2-core machine every comparison of wall throughput at c = 8 and 32
is bounded by the generator's one core (docs/bench.md, rule 3; notes/026).
The server's own CPU per operation is not: each server is started pinned to
CPU 0 (``taskset``, before it starts, notes/028), the generator runs on
CPU 1, and the server's ``utime + stime`` (``/proc/PID/stat``, clock ticks)
is read before and after each measured step:

    server_cpu_us_per_op = server CPU µs over the step / operations answered

* kvtier: ``kvtier serve --memory-capacity 2GiB``, driven over its data
  plane (its path for 1.2 MB blocks over TCP, docs/wire.md) by
  ``kvtier bench --transport data-plane``;
* Redis: ``redis-server`` as ``redis://spawn`` starts it (2 GiB
  ``maxmemory``, ``allkeys-lru``), driven by the bench's own client in the
  same bench invocation (``--peer redis://HOST:PORT``), which measures
  kvtier and then Redis in each step;
* Mooncake Store: ``mooncake_master`` and the process holding its 2 GiB
  segment (both counted as the server), driven by the bench's own Mooncake
  driver (``mooncake_driver.py run``: ``put_from`` / ``get_into`` from
  registered buffers, threads sharing one client), the command the bench
  runs for ``mooncake://spawn``.

Every system on loopback with the system's congestion control; the bench
records what each system's sockets used (``network``). Warm-up 0 s: each
server is warmed once at the start (writes until kvtier and Redis hold
their whole 2 GiB, so measured writes evict), and a step's CPU then counts
only what the step asked for, except the blocks a read step first writes
(kvtier and Redis 64, Mooncake ``--keys 64``): their cost, estimated as that
many writes at the same repeat's c=1 write cost, is subtracted
(``preload_cpu_us``; ``server_cpu_us_per_op_raw`` keeps the raw figure).

A step is used for a ratio only when the server's core was at least
``--busy`` (default 20 %) busy over the step's measured wall time
(``busy_share`` = server CPU s / wall s) and it had no errors: a server that
mostly waited for its generator is measured in too few clock ticks, and its
idle wake-ups weigh on every operation. Such a step is shown, not used. A
cell (system × op × c) is used when most of its repeats are; its figures are
medians of the used repeats, with the spread of all of them shown.

In the same run, pinned to the server's core: memcpy and CRC32C of 1.2 MB
(the SDK's ``crc32c`` package, the hardware instruction), hot (one buffer)
and cold (64 buffers in turn), so the note can say how much of kvtier's
per-write CPU the server's checksum pass is.

    .venv/bin/python scripts/bench-server-cpu.py --out notes/046-server-cpu.json
    .venv/bin/python scripts/bench-server-cpu.py --table notes/046-server-cpu.json
    .venv/bin/python scripts/bench-server-cpu.py --across RECORD...   # the verdict over several runs

Needs ``target/release/kvtier`` (``cargo build --release -p kvtier``),
``redis-server`` and Mooncake (``scripts/setup-mooncake.sh``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _perf import ROOT

from perf import cpu_seconds, header, order, rss_mib, versions, write_record
from perf.services import MOONCAKE_DRIVER, Mooncake, Redis, kvtier_server, mooncake_python, release_binary

SIZE = 1258291  # "1.2MB" as kvtier bench reads it
CLK_TCK = os.sysconf("SC_CLK_TCK")  # /proc/stat's unit
SERVER_CPU, GEN_CPU = 0, 1
PRELOAD_KEYS = 64  # kvtier bench's read chain (kvtier and Redis); Mooncake's driver is given --keys 64
SYSTEMS = ("kvtier", "redis", "mooncake")
OPS = {"write": {"redis": "set", "mooncake": "put"}, "read": {"redis": "get", "mooncake": "get"}}
#: The data-plane targets kept from notes/006 (restated in notes/046-server-cpu.md) in this unit:
#: kvtier's server CPU per op over Redis's.
TARGETS = {"read": 0.83, "write": 1.0}
GEN_SATURATED = 0.90  # docs/bench.md, rule 3

BASELINE_CODE = r"""
import json, sys, time, crc32c
N, SIZE, BUFS = 300, int(sys.argv[1]), 64
src = [bytearray(SIZE) for _ in range(BUFS)]
for b in src:
    b[:] = bytes(range(256)) * (SIZE // 256) + bytes(SIZE % 256)
dst = bytearray(SIZE)
out = {}
def med(f, cold):
    t = []
    for i in range(N):
        b = src[i % BUFS] if cold else src[0]
        t0 = time.perf_counter_ns(); f(b); t.append(time.perf_counter_ns() - t0)
    t.sort()
    return t[len(t) // 2] / 1000
for cold in (False, True):
    k = "cold" if cold else "hot"
    out["crc32c_" + k + "_us"] = med(lambda b: crc32c.crc32c(b), cold)
    out["memcpy_" + k + "_us"] = med(lambda b: dst.__setitem__(slice(None), b), cold)
print(json.dumps(out))
"""


# -- the selection (python/tests/test_server_cpu.py) -----------------------------


def exclusions(row: dict[str, Any], busy: float) -> list[str]:
    """Why a measured step cannot be used for a ratio (empty: it can)."""
    why = []
    if row["errors"]:
        why.append(f"{row['errors']} errors")
    if row["ops"] - row["errors"] <= 0:
        why.append("no operation answered")
    if row["busy_share"] < busy:
        why.append(f"server core {row['busy_share']:.0%} busy < {busy:.0%}")
    return why


def cell(rows: Sequence[dict[str, Any]], busy: float) -> dict[str, Any]:
    """One system × op × c over its repeats: medians of the usable repeats
    (used when most repeats are usable), every repeat's figure kept."""
    ok = [r for r in rows if not exclusions(r, busy)]
    used = len(ok) * 2 > len(rows)
    idle = sorted(r["busy_share"] for r in rows if r["busy_share"] < busy)
    span = f"{idle[0]:.0%}" if idle and idle[0] == idle[-1] else f"{idle[0]:.0%}–{idle[-1]:.0%}" if idle else ""
    excluded = [f"server core {span} busy < {busy:.0%}"] if idle else []
    excluded += sorted({w for r in rows for w in exclusions(r, busy) if not w.startswith("server core")})
    out: dict[str, Any] = {"repeats": len(rows), "usable_repeats": len(ok), "used": used, "excluded": excluded,
                           "usable": [not exclusions(r, busy) for r in rows]}
    for key in ("server_cpu_us_per_op", "throughput_ops_s", "p99_us", "busy_share", "generator_core_share",
                "core0_other_share"):
        if any(key not in r for r in rows):  # core0_other_share: not in notes/046's first run
            continue
        every = [r[key] for r in rows]
        out[key] = {"median": statistics.median([r[key] for r in ok] if ok else every),
                    "min": min(every), "max": max(every), "repeats": every}
    out["ops_per_server_cpu_s"] = 1e6 / out["server_cpu_us_per_op"]["median"]
    out["generator_saturated"] = out["generator_core_share"]["median"] >= GEN_SATURATED
    return out


def summarize_cells(rows: Sequence[dict[str, Any]], busy: float) -> list[dict[str, Any]]:
    keys = list(dict.fromkeys((r["op"], r["concurrency"], r["system"]) for r in rows))
    return [{"op": op, "concurrency": c, "system": s,
             **cell([r for r in rows if (r["op"], r["concurrency"], r["system"]) == (op, c, s)], busy)}
            for op, c, s in keys]


def ratios(cells: Sequence[dict[str, Any]], base: str = "redis") -> list[dict[str, Any]]:
    """kvtier's server CPU per op over each other system's, per op and c,
    only where both cells are used; against the data-plane target for Redis (TARGETS)."""
    by = {(x["op"], x["concurrency"], x["system"]): x for x in cells}
    out = []
    for (op, c, s), k in by.items():
        if s != "kvtier":
            continue
        for peer in (p for p in SYSTEMS if p != "kvtier" and (op, c, p) in by):
            p = by[(op, c, peer)]
            usable = k["used"] and p["used"]
            r = k["server_cpu_us_per_op"]["median"] / p["server_cpu_us_per_op"]["median"] if usable else None
            # Repeat by repeat: the two ran one after the other (kvtier then
            # Redis in one bench invocation), so a slow phase of the shared
            # machine falls on both.
            pairs = [a / b for a, b, ua, ub in zip(k["server_cpu_us_per_op"]["repeats"],
                                                   p["server_cpu_us_per_op"]["repeats"], k["usable"], p["usable"])
                     if ua and ub]
            row: dict[str, Any] = {"op": op, "concurrency": c, "peer": peer, "cpu_ratio": r,
                                   "paired": {"median": statistics.median(pairs), "min": min(pairs),
                                              "max": max(pairs), "repeats": pairs} if usable and pairs else None,
                                   "why_not": [] if usable else
                                   [f"{n}: {', '.join(x['excluded']) or 'too few usable repeats'}"
                                    for n, x in (("kvtier", k), (peer, p)) if not x["used"]]}
            if peer == base:
                row["target"] = TARGETS[op]
                row["meets_target"] = None if r is None else r <= TARGETS[op]
            out.append(row)
    return out


# -- measuring -------------------------------------------------------------------


def core_busy(cpu: int) -> tuple[int, int]:
    """(busy, total) jiffies of one CPU from /proc/stat."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]
            return sum(v) - idle, sum(v)
    raise RuntimeError(f"cpu{cpu} not in /proc/stat")


def server_cpu(pids: Sequence[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


def p99(lat: list[int]) -> float:
    s = sorted(lat)
    return float(s[min(len(s) - 1, int(0.99 * len(s)))]) if s else 0.0


def measured(system: str, op: str, c: int, rep: int, ops: int, errors: int, wall: float, cpu_s: float,
             preload_cpu_us: float, thr: float, p99_us: float, gen_share: float, core0: float) -> dict[str, Any]:
    answered = max(ops - errors, 1)
    return {
        "system": system, "op": op, "concurrency": c, "repeat": rep, "ops": ops, "errors": errors,
        "duration_s": round(wall, 3), "throughput_ops_s": round(thr, 1), "p99_us": p99_us,
        "server_cpu_s": round(cpu_s, 3),
        "server_cpu_us_per_op_raw": round(cpu_s * 1e6 / answered, 1),
        "preload_cpu_us": round(preload_cpu_us),
        "server_cpu_us_per_op": round((cpu_s * 1e6 - preload_cpu_us) / answered, 1),
        "busy_share": round(cpu_s / wall, 3) if wall else 0.0,
        "generator_core_share": round(gen_share, 3),
        "core0_other_share": round(core0, 3), "load1": os.getloadavg()[0],
    }


class Run:
    def __init__(self, a: argparse.Namespace, work: Path):
        self.a, self.work = a, work
        self.binary = Path(a.binary)
        self.kv = kvtier_server(self.binary, ["--memory-capacity", "2GiB"], cpus={SERVER_CPU})
        try:  # a server that failed to start leaves none of the others running
            self.redis = Redis.start(cpus={SERVER_CPU}, maxmemory="2gb", directory=work)
            try:
                self.mc = Mooncake.start(mem_bytes=2 << 30, cpus={SERVER_CPU})
            except BaseException:
                self.redis.stop()
                raise
        except BaseException:
            self.kv.stop()
            raise
        self.pids = {"kvtier": [self.kv.pid], "redis": [self.redis.pid], "mooncake": list(self.mc.info["pids"])}
        #: per repeat and system: c=1 write CPU µs per op (the read preload's estimate)
        self.write_cost: dict[tuple[int, str], float] = {}

    def stop(self) -> None:
        for s in (self.mc, self.redis):
            s.stop()
        self.kv.stop()

    def bench(self, op: str, c: int, duration: float, out: Path) -> dict[str, Any]:
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["taskset", "-c", str(GEN_CPU), str(self.binary), "bench", "--target", self.kv.grpc,
                        "--workload", op, "--transport", "data-plane", "--value-size", str(SIZE),
                        "--concurrency", str(c), "--duration", f"{duration}s", "--warmup", "0s",
                        "--peer", self.redis.url, "--quiet", "--out", str(out)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rec: dict[str, Any] = json.loads((out / "record.json").read_text())
        return rec

    def mooncake(self, op: str, c: int, duration: float) -> dict[str, Any]:
        r = subprocess.run(["taskset", "-c", str(GEN_CPU), str(mooncake_python()), str(MOONCAKE_DRIVER), "run",
                            "--master", self.mc.info["master"], "--metadata", self.mc.info["metadata"],
                            "--op", OPS[op]["mooncake"], "--concurrency", str(c), "--duration", str(duration),
                            "--warmup", "0", "--value-size", str(SIZE), "--keys", str(PRELOAD_KEYS)],
                           check=True, capture_output=True, text=True)
        out: dict[str, Any] = json.loads(r.stdout)
        return out

    def warm(self) -> dict[str, Any]:
        """Writes until kvtier holds its 2 GiB and Redis has evicted (as
        notes/035); Mooncake's driver removes its keys after each run, so
        it gets one unmeasured put run."""
        runs = 0
        while runs < 8:
            runs += 1
            self.bench("write", 8, 2.0, self.work / "warm")
            evicted = subprocess.run(["redis-cli", "-p", str(self.redis.port), "info", "stats"],
                                     capture_output=True, text=True).stdout
            ev = int(next((x.split(":")[1] for x in evicted.splitlines() if x.startswith("evicted_keys:")), "0"))
            if rss_mib(self.kv.pid) >= 2048 and ev > 0:
                break
        else:
            sys.exit(f"not filled after 8 runs: kvtier RSS {rss_mib(self.kv.pid):.0f} MiB, Redis evicted {ev}")
        self.mooncake("write", 1, 2.0)
        return {"bench_runs": runs, "kvtier_rss_mib": round(rss_mib(self.kv.pid)), "redis_evicted_keys": ev}

    def step(self, op: str, c: int, rep: int, part: str) -> list[dict[str, Any]]:
        d = self.a.duration
        names = ["kvtier", "redis"] if part == "bench" else ["mooncake"]
        before = {n: server_cpu(self.pids[n]) for n in names}
        b0 = core_busy(SERVER_CPU)
        rec: dict[str, Any] = {}
        mc: dict[str, Any] = {}
        if part == "bench":
            rec = self.bench(op, c, d, self.work / "step")
        else:
            mc = self.mooncake(op, c, d)
        b1 = core_busy(SERVER_CPU)
        cpu = {n: server_cpu(self.pids[n]) - before[n] for n in names}
        # What else ran on the server's core meanwhile (other engineers'
        # builds on this shared machine): its busy time less the servers'.
        total_s = max(b1[1] - b0[1], 1) / CLK_TCK
        core0 = max(0.0, (b1[0] - b0[0]) / CLK_TCK - sum(cpu.values())) / total_s
        rows = []
        for n in names:
            pre = PRELOAD_KEYS * self.write_cost.get((rep, n), 0.0) if op == "read" else 0.0
            if n == "mooncake":
                lat = mc["latencies_us"]
                wall = float(mc["duration_s"])
                rows.append(measured(n, op, c, rep, mc["ops"], mc["errors"], wall, cpu[n], pre,
                                     (mc["ops"] - mc["errors"]) / wall, p99(lat), mc["generator_cpu_s"] / wall,
                                     core0))
                continue
            st = rec["steps"][0] if n == "kvtier" else rec["peers"][0]["steps"][0]
            o = st["ops"][op if n == "kvtier" else OPS[op]["redis"]]
            rows.append(measured(n, op, c, rep, o["ops"], o["errors"], st["duration_s"], cpu[n], pre,
                                 o["throughput_ops_s"], o["latency_us"]["e2e"]["p99"],
                                 st["generator_cpu_utilisation"] * st["generator_cores"], core0))
        for r in rows:
            if op == "write" and c == 1:
                self.write_cost[(rep, r["system"])] = r["server_cpu_us_per_op_raw"]
            print(json.dumps({k: r[k] for k in ("system", "op", "concurrency", "repeat", "throughput_ops_s",
                                                 "server_cpu_us_per_op", "busy_share", "p99_us", "load1")}),
                  flush=True)
        if part == "bench":
            self.network = rec.get("network")
            self.clients = {"kvtier": rec.get("api"), "redis": rec["peers"][0].get("client")}
        return rows


def baselines() -> dict[str, Any]:
    """memcpy and CRC32C of 1.2 MB on the server's core, medians of 300."""
    r = subprocess.run(["taskset", "-c", str(SERVER_CPU), sys.executable, "-c", BASELINE_CODE, str(SIZE)],
                       check=True, capture_output=True, text=True)
    out: dict[str, Any] = json.loads(r.stdout)
    out["load1"] = os.getloadavg()[0]
    return out


def wait_load(limit: float, most_s: float) -> dict[str, Any]:
    t0 = time.monotonic()
    first = os.getloadavg()[0]
    while os.getloadavg()[0] >= limit and time.monotonic() - t0 < most_s:
        time.sleep(15)
    return {"limit": limit, "at_start": first, "when_measuring": os.getloadavg()[0],
            "waited_s": round(time.monotonic() - t0), "met": os.getloadavg()[0] < limit}


def binary_state(path: Path, build: str | None) -> dict[str, Any]:
    st = path.stat()
    out: dict[str, Any] = {"path": str(path), "mtime_utc": datetime.datetime.fromtimestamp(
        st.st_mtime, datetime.timezone.utc).isoformat(timespec="seconds")}
    if build:
        out["build"] = json.loads(Path(build).read_text())
    return out


# -- the note's tables -----------------------------------------------------------


def other(x: dict[str, Any]) -> str:
    """The median share of the server's core other processes took ("–" in
    a record written before it was recorded)."""
    return f"{x['core0_other_share']['median']:.0%}" if "core0_other_share" in x else "–"


def table(rec: dict[str, Any]) -> str:
    """The note's tables, recomputed from the record's rows."""
    busy = rec["busy_threshold"]
    rec = {**rec, "cells": summarize_cells(rec["rows"], busy)}
    rec["ratios"] = ratios(rec["cells"])
    rec["crc_share"] = crc_share(rec["cells"], rec["baselines"])
    out = [f"Server core busy threshold {busy:.0%}; medians of used repeats (all repeats when none is), "
           f"spread min–max of all {rec['repeats']}; ✗ = not used for a ratio; ⚠ = generator ≥ "
           f"{GEN_SATURATED:.0%} of its core (wall throughput measures the generator).", ""]
    for op in ("read", "write"):
        out += [f"### 1.2 MB {op}s", "",
                "| c | system | server CPU µs/op (spread) | ops per server-CPU-s | p99 µs | wall ops/s (spread) |"
                " server core busy | other work on it | used |", "|---|---|---|---|---|---|---|---|---|"]
        for x in (x for x in rec["cells"] if x["op"] == op):
            cpu, thr = x["server_cpu_us_per_op"], x["throughput_ops_s"]
            out.append(
                f"| {x['concurrency']} | {x['system']} | {cpu['median']:.0f} ({cpu['min']:.0f}–{cpu['max']:.0f}) "
                f"| {x['ops_per_server_cpu_s']:,.0f} | {x['p99_us']['median']:,.0f} "
                f"| {thr['median']:,.0f} ({thr['min']:,.0f}–{thr['max']:,.0f}){' ⚠' if x['generator_saturated'] else ''}"
                f" | {x['busy_share']['median']:.0%} | {other(x)} "
                f"| {'yes' if x['used'] else '✗ ' + '; '.join(x['excluded'])} ({x['usable_repeats']}/{x['repeats']}) |")
        out.append("")
    out += ["### kvtier's server CPU per op over each peer's", "",
            "| op | c | peer | ratio of medians | repeat by repeat: median (spread) | target | verdict |",
            "|---|---|---|---|---|---|---|"]
    for r in rec["ratios"]:
        ratio = "–" if r["cpu_ratio"] is None else f"{r['cpu_ratio']:.2f}×"
        pr = r.get("paired")
        paired = "–" if not pr else f"{pr['median']:.2f}× ({pr['min']:.2f}–{pr['max']:.2f})"
        verdict = ("not measured: " + "; ".join(r["why_not"]) if r["cpu_ratio"] is None else
                   ("" if "target" not in r else "meets" if r["meets_target"] else "misses"))
        target = f"≤ {r['target']:.2f}×" if "target" in r else ""
        out.append(f"| {r['op']} | {r['concurrency']} | {r['peer']} | {ratio} | {paired} | {target} | {verdict} |")
    b = rec["baselines"]
    out += ["", "### On the server's core, same run (µs per 1.2 MB, medians of 300; start / end of the run)", "",
            "| | hot (one buffer) | cold (64 buffers) |", "|---|---|---|"]
    for k in ("crc32c", "memcpy"):
        out.append(f"| {k} | {b['start'][k + '_hot_us']:.1f} / {b['end'][k + '_hot_us']:.1f} "
                   f"| {b['start'][k + '_cold_us']:.1f} / {b['end'][k + '_cold_us']:.1f} |")
    out += ["", "### The server's CRC32C pass in kvtier's write CPU", "",
            "| c | kvtier µs/write | one CRC32C pass (hot–cold) | share | kvtier less one pass over Redis |",
            "|---|---|---|---|---|"]
    for x in rec["crc_share"]:
        over = "–" if x["kvtier_less_crc_over_redis"] is None else (
            f"{x['kvtier_less_crc_over_redis'][0]:.2f}–{x['kvtier_less_crc_over_redis'][1]:.2f}×")
        out.append(f"| {x['concurrency']} | {x['kvtier_us']:.0f} | {x['crc_us'][0]:.0f}–{x['crc_us'][1]:.0f} "
                   f"| {x['share'][0]:.0%}–{x['share'][1]:.0%} | {over} |")
    return "\n".join(out)


def crc_share(cells: list[dict[str, Any]], base: dict[str, Any]) -> list[dict[str, Any]]:
    """The server's one CRC32C pass per write against kvtier's per-write CPU
    (reads: the server checksums nothing, docs/wire.md)."""
    by = {(x["op"], x["concurrency"], x["system"]): x for x in cells}
    crc = (min(base["start"]["crc32c_hot_us"], base["end"]["crc32c_hot_us"]),
           max(base["start"]["crc32c_cold_us"], base["end"]["crc32c_cold_us"]))
    out = []
    for (op, c, s), k in by.items():
        if op != "write" or s != "kvtier":
            continue
        kv = k["server_cpu_us_per_op"]["median"]
        r = by.get(("write", c, "redis"))
        both = r is not None and k["used"] and r["used"]
        out.append({"concurrency": c, "kvtier_us": kv, "crc_us": list(crc), "share": [crc[0] / kv, crc[1] / kv],
                    "kvtier_less_crc_over_redis": [(kv - crc[1]) / r["server_cpu_us_per_op"]["median"],
                                                   (kv - crc[0]) / r["server_cpu_us_per_op"]["median"]]
                    if both and r is not None else None})
    return out


def across(paths: Sequence[str]) -> str:
    """kvtier over Redis per op and c, one ratio of medians per record, and
    in how many records it meets the data-plane target (TARGETS)."""
    runs = []
    for p in paths:
        rec = json.loads(Path(p).read_text())
        runs.append({(r["op"], r["concurrency"]): r for r in ratios(summarize_cells(rec["rows"], rec["busy_threshold"]))
                     if r["peer"] == "redis"})
    conc = sorted({c for run in runs for _, c in run})
    out = [f"kvtier's server CPU per op over Redis's, ratio of medians, runs in the order {', '.join(paths)}:", "",
           "| | " + " | ".join(f"c = {c}" for c in conc) + " | target |", "|---" * (len(conc) + 2) + "|"]
    for op in ("read", "write"):
        cells = []
        for c in conc:
            rs = [run.get((op, c)) for run in runs]
            vals = " / ".join("–" if r is None or r["cpu_ratio"] is None else f"{r['cpu_ratio']:.2f}" for r in rs)
            met = sum(1 for r in rs if r is not None and r.get("meets_target"))
            cells.append(f"{vals}: meets in {met} of {len(rs)}")
        out.append(f"| {op}s | " + " | ".join(cells) + f" | ≤ {TARGETS[op]:.2f}× |")
    return "\n".join(out)


def main() -> None:
    if sys.argv[1:2] == ["--table"]:
        print(table(json.loads(Path(sys.argv[2]).read_text())))
        return
    if sys.argv[1:2] == ["--across"]:
        print(across(sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "notes/046-server-cpu.json"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="measured seconds per step (default 3)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--busy", type=float, default=0.20, help="least server-core busy share for a ratio (0.20)")
    ap.add_argument("--binary", default=str(release_binary()))
    ap.add_argument("--build-state", help="JSON of the binary's build (commit, dirty, result), kept in the record")
    ap.add_argument("--wait-load", type=float, default=1.5, help="wait for the 1-min load below this (1.5)")
    ap.add_argument("--wait-most", type=float, default=900, help="but at most this many seconds (900)")
    a = ap.parse_args()
    for tool in ("taskset", "redis-server", "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found on PATH")
    conc = [int(x) for x in a.concurrency.split(",")]
    load = wait_load(a.wait_load, a.wait_most)
    print(f"load: {load}", flush=True)
    head = header(versions=versions("kvtier", "redis-server", paths={"kvtier": a.binary}))
    work = Path(tempfile.mkdtemp(prefix="kvtier-server-cpu-"))
    t0 = time.monotonic()
    run = Run(a, work)
    try:
        head["versions"]["mooncake-store"] = run.mc.version()
        idle = {n: server_cpu(p) for n, p in run.pids.items()}
        time.sleep(2)
        idle = {n: round((server_cpu(run.pids[n]) - v) / 2, 4) for n, v in idle.items()}
        fill = run.warm()
        base = {"start": baselines()}
        rows: list[dict[str, Any]] = []
        for rep in range(a.repeat):
            for op in ("write", "read"):  # writes first: a read's preload estimate is the repeat's c=1 write
                for c in conc:
                    for part in order(["bench", "mooncake"], rep):
                        rows += run.step(op, c, rep, part)
        base["end"] = baselines()
    finally:
        run.stop()
        shutil.rmtree(work, ignore_errors=True)
    cells = summarize_cells(rows, a.busy)
    rec = {
        "title": "Server CPU per 1.2 MB read and write: kvtier, Redis, Mooncake Store at c = 1, 8, 32",
        "placement": {"server_cpu": SERVER_CPU, "generator_cpu": GEN_CPU},
        "clients": {**getattr(run, "clients", {}),
                    "mooncake": "mooncake_driver.py run (put_from/get_into, threads, one client)"},
        "network": getattr(run, "network", None),
        "busy_threshold": a.busy, "repeats": a.repeat, "duration_s": a.duration, "value_size": SIZE,
        "preload_keys": PRELOAD_KEYS, "load": load, "idle_server_cpu_share": idle, "fill": fill,
        "binary": binary_state(Path(a.binary), a.build_state), "baselines": base,
        "wall_s": round(time.monotonic() - t0), "cells": cells, "ratios": ratios(cells),
        "crc_share": crc_share(cells, base), "rows": rows,
    }
    write_record(a.out, rec, head)
    print(table(rec))


if __name__ == "__main__":
    main()
