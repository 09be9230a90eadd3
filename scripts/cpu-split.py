#!/usr/bin/env python3
"""Where a c=1 write (or read) of a 1.2 MB block spends CPU, kvtier against
Redis (notes/035, notes/036): each side's CPU time per request, measured with
`perf stat -e task-clock,page-faults` on the server process and on the
client process, next to the wall time per request.

Placement as notes/027 and 032: the server (kvtier serve, redis-server) on
CPU 1, the client on CPU 0, every system on the machine's congestion
control. kvtier is driven by `kvtier bench` (data plane, the client's
CRC32C before sending, the server's while receiving); Redis by
`redis-benchmark` (SET of 1.2 MB values, a key range so every SET makes a
new key), its own reference client. The client figures therefore compare
two different clients; the server figures compare the servers. Both stores
are filled to their 2 GiB memory first (unmeasured), so every measured write
evicts and reuses memory (Redis: `maxmemory 2gb`, `allkeys-lru`, as
`redis://spawn`). Variants alternate within each repeat; medians are
compared.

With --ablate-crc a third variant runs: kvtier built against a stand-in
crc32c crate that computes nothing (scripts/cost-split.py's
`build_without_crc`, notes/032), which removes every CRC32C pass, the
client's and the server's, and nothing else. It is a measuring instrument,
not a product: it checks nothing.

With --client-crc-free, kvtier built against a crc32c whose one-shot
`crc32c()` memoises the buffer it saw last (the bench writes one payload
over and over): the client's checksum before each write costs nothing, every
receiver's checksum as the bytes arrive is computed as shipped. It bounds
what any scheme that takes the client's pass off the request's path (a CRC
trailer, another core) can gain.

With --floor, scripts/tcp-floor.c runs the same requests with nothing but
the transfer: one loopback TCP connection, one buffer on each side, a 1-byte
opcode and acknowledgement. With one buffer, always in the cache, no TCP
store whose sender copies can beat it with this placement on a block that is
in the cache; on cold memory it is no bound (notes/039). --floor-splice adds
the floor whose sender splices; --floor-buffers 64 makes the floor's server
take one of 64 buffers per request at random, as kvtier bench reads one of 64
blocks (notes/039).

--workload read measures GETs (Redis: redis-benchmark on its one key, and
kvtier bench's own Redis client, the other half of docs/bench.md's rule 2; kvtier:
its 64 preloaded blocks). --binary NAME=PATH adds any other kvtier binary.
`--table RECORD` prints a record's tables (notes/036).

  cargo build --release -p kvtier
  python3 scripts/cpu-split.py --repeat 5 --ablate-crc --out notes/035-cpu-split.json
  python3 scripts/cpu-split.py --repeat 5 --workload write,read --floor --ablate-crc --client-crc-free \
      --out notes/036-write-floor.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _perf import ROOT

from perf import header, rss_mib, versions, write_record
from perf.services import Redis, kvtier_server

SIZE = 1258291
BIN = ROOT / "target/release/kvtier"


def perf_attach(pid: int, out: Path) -> subprocess.Popen:
    return subprocess.Popen(["perf", "stat", "-x", ",", "-e", "task-clock,page-faults", "-p", str(pid),
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_read(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        f = line.split(",")
        if len(f) > 2 and f[2] in ("task-clock", "page-faults"):
            out[f[2]] = float(f[0])
    return out


def stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)


def per_request(server: dict, client: dict, ops: int, seconds: float) -> dict:
    return {
        "ops": ops,
        "wall_us": seconds * 1e6 / ops,
        "server_cpu_us": server["task-clock"] * 1000 / ops,
        "client_cpu_us": client["task-clock"] * 1000 / ops,
        "server_page_faults": server["page-faults"] / ops,
        "client_page_faults": client["page-faults"] / ops,
    }


def cost_split():
    spec = importlib.util.spec_from_file_location("cost_split", ROOT / "scripts/cost-split.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_with_crc32c(work: Path, variant: str) -> Path:
    """kvtier against a stand-in crc32c crate (scripts/cost-split.py):
    `null` (no checksum anywhere) or `client-write-free`."""
    return cost_split().build_with_crc32c(work, variant)


def kvtier(tmp: Path, duration: float, binary: Path = BIN, workload: str = "write") -> dict:
    srv = kvtier_server(binary, ["--memory-capacity", "2GiB"], cpus={1})
    try:
        if workload == "write":
            # Fill the tier first (unmeasured), until the process holds the
            # whole 2 GiB: every measured write then evicts, as Redis's does
            # at its 2 GiB maxmemory. On a slow day one 3 s fill falls short,
            # and the measured run then pays page faults Redis's does not.
            # (Reads hit the 64 blocks the bench preloads in its own first
            # step, inside the measured CPU: ~2 µs per read, notes/036.)
            for _ in range(8):
                subprocess.run(["taskset", "-c", "0", str(binary), "bench", "--target", srv.grpc, "--workload",
                                "write", "--transport", "data-plane", "--value-size", str(SIZE), "--concurrency",
                                "1", "--duration", "3s", "--warmup", "0s", "--quiet", "--out", str(tmp / "kv-fill")],
                               check=True, stdout=subprocess.DEVNULL)
                if rss_mib(srv.pid) >= 2048:
                    break
            else:
                sys.exit(f"kvtier's resident memory stayed at {rss_mib(srv.pid):.0f} MiB after 24 s of filling")
        sp = perf_attach(srv.pid, tmp / "kv-server.txt")
        time.sleep(0.3)
        out = tmp / "kv-bench"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["taskset", "-c", "0", "perf", "stat", "-x", ",", "-e", "task-clock,page-faults",
                        "-o", str(tmp / "kv-client.txt"), "--", str(binary), "bench", "--target", srv.grpc,
                        "--workload", workload, "--transport", "data-plane", "--value-size", str(SIZE),
                        "--concurrency", "1", "--duration", f"{duration}s", "--warmup", "0s",
                        "--quiet", "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
        stop(sp)
    finally:
        srv.stop()
    o = json.loads((out / "record.json").read_text())["steps"][0]["ops"][workload]
    assert o["errors"] == 0, o
    return per_request(perf_read(tmp / "kv-server.txt"), perf_read(tmp / "kv-client.txt"),
                       o["ops"], o["ops"] / o["throughput_ops_s"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_floor(work: Path) -> Path:
    """scripts/tcp-floor.c, compiled: one buffer each side, no framing, no store."""
    work.mkdir(parents=True, exist_ok=True)
    exe = work / "tcp-floor"
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(exe), str(ROOT / "scripts/tcp-floor.c")], check=True)
    return exe


def floor(tmp: Path, duration: float, exe: Path, workload: str, buffers: int = 1) -> dict:
    port = free_port()
    srv = subprocess.Popen(["taskset", "-c", "1", str(exe), "serve", str(port), str(SIZE), str(buffers)])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "tcp-floor did not start"
                time.sleep(0.02)
        sp = perf_attach(srv.pid, tmp / "f-server.txt")
        time.sleep(0.3)
        out = subprocess.run(["taskset", "-c", "0", "perf", "stat", "-x", ",", "-e", "task-clock,page-faults",
                              "-o", str(tmp / "f-client.txt"), "--", str(exe), "client", str(port), str(SIZE),
                              workload, str(duration)], check=True, capture_output=True, text=True).stdout
        stop(sp)
    finally:
        srv.kill()
        srv.wait()
    ops, seconds = out.split()
    return per_request(perf_read(tmp / "f-server.txt"), perf_read(tmp / "f-client.txt"), int(ops), float(seconds))


def redis(tmp: Path, duration: float, rate_guess: float, workload: str = "write") -> dict:
    srv = Redis.start(cpus={1}, maxmemory="2gb", directory=tmp)
    port = srv.port
    try:
        if workload == "write":
            # Fill to maxmemory first (unmeasured): every measured SET then evicts.
            fill = ["-n", "2400", "-r", "100000000"]
        else:
            # The one key redis-benchmark's GET asks for ("key:__rand_int__" without -r).
            fill = ["-n", "1"]
        subprocess.run(["taskset", "-c", "0", "redis-benchmark", "-p", str(port), "-t", "set", "-d", str(SIZE),
                        "-c", "1", *fill, "-q"], check=True, stdout=subprocess.DEVNULL)
        sp = perf_attach(srv.pid, tmp / "r-server.txt")
        time.sleep(0.3)
        n = max(500, int(rate_guess * duration))
        t0 = time.monotonic()
        subprocess.run(["taskset", "-c", "0", "perf", "stat", "-x", ",", "-e", "task-clock,page-faults",
                        "-o", str(tmp / "r-client.txt"), "--", "redis-benchmark", "-p", str(port),
                        *(["-t", "set", "-r", "100000000"] if workload == "write" else ["-t", "get"]),
                        "-d", str(SIZE), "-c", "1", "-n", str(n), "-q"],
                       check=True, stdout=subprocess.DEVNULL)
        seconds = time.monotonic() - t0
        stop(sp)
        subprocess.run(["redis-cli", "-p", str(port), "flushall"], capture_output=True)
    finally:
        srv.stop()
    return per_request(perf_read(tmp / "r-server.txt"), perf_read(tmp / "r-client.txt"), n, seconds)


def redis_bench_client(tmp: Path, duration: float, binary: Path) -> dict:
    """Redis GETs driven by kvtier bench's own Redis client, the other half of
    docs/bench.md's rule 2 (the Redis denominator is the better of this and
    redis-benchmark). The bench drives a kvtier server beside it in the same
    run; only Redis's wall time per request is taken, no CPU."""
    srv = kvtier_server(binary, ["--memory-capacity", "2GiB"], cpus={1})
    try:
        out = tmp / "rb-bench"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["taskset", "-c", "0", str(binary), "bench", "--target", srv.grpc, "--workload", "read",
                        "--transport", "data-plane", "--value-size", str(SIZE), "--concurrency", "1",
                        "--duration", f"{duration}s", "--warmup", "0s", "--peer", "redis://spawn",
                        "--peer-cpus", "1", "--quiet", "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    finally:
        srv.stop()
    o = json.loads((out / "record.json").read_text())["peers"][0]["steps"][0]["ops"]["get"]
    assert o["errors"] == 0, o
    return {"ops": o["ops"], "wall_us": 1e6 / o["throughput_ops_s"]}


def table(record: dict) -> str:
    """Markdown of a record: per workload, each system's medians, its ops/s
    over the best Redis number (the better of redis-benchmark and, where it
    ran, kvtier bench's client) and over the TCP floor, and every repeat."""
    out = []
    for workload in dict.fromkeys(r["workload"] for r in record["rows"]):
        rows = [r for r in record["rows"] if r["workload"] == workload]
        systems = list(dict.fromkeys(r["system"] for r in rows))

        def med(system: str, key: str, rows: list[dict] = rows) -> float | None:
            vals = [r[key] for r in rows if r["system"] == system and key in r]
            return statistics.median(vals) if vals else None

        redis_best = min(w for s in systems if s.startswith("redis") if (w := med(s, "wall_us")) is not None)
        floor = med("tcp floor", "wall_us")
        out += [f"### {workload}s, c=1, 1.2 MB (µs per request, medians of {max(r['repeat'] for r in rows)})", "",
                "| system | wall | ops/s | server CPU | client CPU | ops/s over Redis's best | wall over the TCP floor's |"
                " per-repeat wall |", "|---|---|---|---|---|---|---|---|"]
        for s in systems:
            wall = med(s, "wall_us")
            assert wall is not None, f"{s}: no wall time"
            cpu = [med(s, k) for k in ("server_cpu_us", "client_cpu_us")]
            reps = ", ".join(f"{r['wall_us']:.0f}" for r in rows if r["system"] == s)
            out.append(f"| {s} | {wall:.1f} | {1e6 / wall:,.0f} | "
                       + " | ".join("–" if c is None else f"{c:.1f}" for c in cpu)
                       + f" | {redis_best / wall:.2f}× | " + ("–" if floor is None else f"{wall / floor:.2f}×")
                       + f" | {reps} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    if sys.argv[1:2] == ["--table"]:
        print(table(json.loads(Path(sys.argv[2]).read_text())))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--out", default=str(ROOT / "notes/035-cpu-split.json"))
    ap.add_argument("--workload", default="write", help="write, read, or both: write,read")
    ap.add_argument("--ablate-crc", action="store_true", help="also kvtier with every CRC32C pass stubbed out")
    ap.add_argument("--client-crc-free", action="store_true",
                    help="also kvtier whose client's checksum before each write costs nothing (a memoising "
                         "crc32c; every receiver's checksum as shipped)")
    ap.add_argument("--floor", action="store_true",
                    help="also scripts/tcp-floor.c: one loopback TCP connection, one buffer each side, nothing else")
    ap.add_argument("--floor-splice", action="store_true",
                    help="also the floor whose sender (the client of a write, the server of a read) sends by "
                         "vmsplice + splice, without the kernel's copy (notes/037, 039)")
    ap.add_argument("--floor-buffers", type=int, default=1, metavar="N",
                    help="the floor's server takes one of N buffers per request, at random (default 1; 64 touches "
                         "as much memory as kvtier's reads of its 64 preloaded blocks, in the same way, notes/039)")
    ap.add_argument("--binary", action="append", default=[], metavar="NAME=PATH",
                    help="also this kvtier binary, named NAME in the record (repeatable)")
    ap.add_argument("--baselines", action="store_true",
                    help="also the engine's criterion baselines on CPU 1: CRC32C of 1.2 MB from the cache and not, "
                         "memcpy (scripts/cost-split.py)")
    ap.add_argument("--work", default=str(ROOT / "out/035-cpu-split"))
    a = ap.parse_args()
    for tool in ("perf", "redis-server", "redis-benchmark", "redis-cli") + (("cc",) if a.floor or a.floor_splice else ()):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found on PATH")
    head = header(versions=versions("kvtier", "perf", "redis-server", "redis-benchmark",
                                    *(("cc",) if a.floor or a.floor_splice else ()), paths={"kvtier": BIN}))
    workloads = a.workload.split(",")
    if not set(workloads) <= {"read", "write"}:
        sys.exit(f"--workload: read and/or write, not {a.workload}")
    tmp = Path(tempfile.mkdtemp(prefix="kvtier-cpu-"))
    systems: dict = {"kvtier": BIN, "redis": None}
    for spec in a.binary:
        name, _, path = spec.partition("=")
        if not path or not Path(path).is_file():
            sys.exit(f"--binary {spec}: expected NAME=PATH to a kvtier binary")
        systems[name] = Path(path)
    if a.client_crc_free:
        systems["kvtier, client's write CRC free"] = build_with_crc32c(Path(a.work), "client-write-free")
    if a.ablate_crc:
        systems["kvtier, no CRC32C"] = build_with_crc32c(Path(a.work), "null")
    floor_exe = build_floor(Path(a.work)) if a.floor or a.floor_splice else None
    if a.floor:
        systems["tcp floor"] = floor_exe
    if a.floor_splice:
        systems["tcp floor, spliced send"] = floor_exe
    if "read" in workloads:
        systems["redis, kvtier bench's client"] = BIN
    rows = []
    rate = {"write": 3000.0, "read": 3000.0}
    for rep in range(1, a.repeat + 1):
        for workload in workloads:
            for system, binary in systems.items():
                if system == "redis":
                    r = redis(tmp, a.duration, rate[workload], workload)
                    rate[workload] = 1e6 / r["wall_us"]
                elif system == "tcp floor":
                    r = floor(tmp, a.duration, binary, workload, a.floor_buffers)
                elif system == "tcp floor, spliced send":
                    r = floor(tmp, a.duration, binary, f"{workload}-splice", a.floor_buffers)
                elif system == "redis, kvtier bench's client":
                    if workload != "read":
                        continue
                    r = redis_bench_client(tmp, a.duration, binary)
                else:
                    r = kvtier(tmp, a.duration, binary, workload)
                row = {"workload": workload, "system": system, "repeat": rep,
                       **{k: round(v, 2) for k, v in r.items()}}
                print(json.dumps(row), flush=True)
                rows.append(row)
    keys = ("wall_us", "server_cpu_us", "client_cpu_us", "server_page_faults", "client_page_faults")
    summary: dict = {}
    for workload in workloads if rows else []:
        mine = [r for r in rows if r["workload"] == workload]
        ran = [s for s in systems if any(r["system"] == s for r in mine)]
        med = {s: {f"{k}_median": statistics.median(r[k] for r in mine if r["system"] == s)
                   for k in keys if all(k in r for r in mine if r["system"] == s)}
               for s in ran}
        for s in ran:
            if s == "redis":
                continue
            if "server_cpu_us_median" in med[s]:  # not for a wall-time-only row
                med[f"{s} minus redis, us"] = {
                    k: round(med[s][f"{k}_median"] - med["redis"][f"{k}_median"], 1)
                    for k in ("wall_us", "server_cpu_us", "client_cpu_us")}
            med[f"{s} ops/s over redis's"] = round(med["redis"]["wall_us_median"] / med[s]["wall_us_median"], 3)
        # Record shape of notes/035 (writes only) kept: the summary is per
        # system there, per workload and system when several ran.
        summary.update(med if workloads == ["write"] else {workload: med})
    what = " and ".join(f"{w}s" for w in workloads)
    write_record(a.out, {
        "title": f"c=1 {what} of 1.2 MB blocks: CPU per request on each side, kvtier vs Redis",
        "placement": {"server_cpu": 1, "client_cpu": 0},
        "clients": {"kvtier": "kvtier bench (data plane)",
                    "redis": "redis-benchmark -t set -r 100000000 (writes), -t get (reads)",
                    **({"tcp floor": "scripts/tcp-floor.c client"} if a.floor else {}),
                    **({"tcp floor, spliced send": "scripts/tcp-floor.c client (write-splice, read-splice)"}
                       if a.floor_splice else {})},
        "floor_buffers": a.floor_buffers,
        "binaries": {k: str(v) for k, v in systems.items() if v is not None}, "summary": summary, "rows": rows,
        **({"baselines": cost_split().baselines(argparse.Namespace(server_cpu="1"))} if a.baselines else {}),
    }, head)


if __name__ == "__main__":
    main()
