#!/usr/bin/env python3
"""Reproduces notes/026-comparisons (notes/013's rules, the current binary):
kvtier (data plane) vs Redis vs Mooncake Store, 1.2 MB reads and writes of
memory-tier hits at c = 1, 8, 32, under the comparison rules of docs/bench.md
("Comparisons"):

1. Every system on the same congestion control: the machine's default
   (kvtier's server and client use it unless told otherwise), or the one
   ``--system-cc`` names, set for the whole machine for the run and restored
   on exit (root). The bench records what each system's sockets really ran.
2. Redis: the better of the bench's own client and redis-benchmark (SET with
   a key range, so each makes a new key as kvtier's writes do). Mooncake: its
   own Python API from separate processes (no store benchmark tool ships with
   it; the bench records that).
3. Steps where a generator is saturated, or that had errors, get no ratio;
   medians over ``--repeat`` alternating repeats; outlier repeats are listed.
4. The note's tables, its perf record and notes/README.md's table are
   generated from the records by scripts/note-comparisons.py.

Placement: the systems under test (kvtier serve, redis-server, Mooncake's
master and its memory segment) on ``--server-cpus``, the generators (kvtier
bench, redis-benchmark, the Mooncake driver's workers) on ``--gen-cpus``; each
a CPU list (``1``, ``0-7``, ``8-15,24``). kvtier serve is started pinned
(``perf.services.kvtier_server``: its runtime sizes itself to those CPUs,
notes/028), a fresh one per workload. Only one system is under load at a
time. Each holds 2 GiB (kvtier's memory tier, Redis maxmemory with
allkeys-lru, Mooncake's segment).

Usage: scripts/bench-data-plane.py [OUT_DIR] [flags]  (scripts/bench-data-plane.sh
runs it). Every flag's default comes from the environment variable the shell
version read, so the notes' commands (``NOTE=0 SYSTEM_CC=reno
scripts/bench-data-plane.sh out/x``) still mean what they did: DURATION=3s
WARMUP=1s C=1,8,32 SIZE=1258291 REPEAT=3 SYSTEM_CC= SERVER_CPU=1 GEN_CPU=0
NOTE=1 (0: records only, no note or notes/README.md update)
NOTE_PATH=notes/026-comparisons SERVER_MALLOC_CONF= (jemalloc options for
kvtier serve only, e.g. dirty_decay_ms:-1 for notes/017; recorded in
OUT/server-env.txt). Outputs: OUT/read and OUT/write (kvtier bench's records,
given perf's header by ``perf.stamp``), then the note through
scripts/note-comparisons.py.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from _perf import ROOT

from perf.services import kvtier_server, mooncake_python, release_binary
from perf.stamp import main as stamp

CC_PATH = Path("/proc/sys/net/ipv4/tcp_congestion_control")
PEERS = ("redis", "mooncake")


def cpu_list(text: str) -> list[int]:
    """``0-7,9`` -> [0, 1, ..., 7, 9] (taskset's list syntax)."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise argparse.ArgumentTypeError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise argparse.ArgumentTypeError(f"no CPUs in {text!r}")
    return sorted(cpus)


def cpu_text(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> ``0-2,5``: the short form taskset and kvtier bench read."""
    parts: list[str] = []
    start = prev = cpus[0]
    for c in [*cpus[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(parts)


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", type=Path, default=Path("out/026-comparisons"))
    ap.add_argument("--duration", default=env("DURATION", "3s"))
    ap.add_argument("--warmup", default=env("WARMUP", "1s"))
    ap.add_argument("-c", "--concurrency", default=env("C", "1,8,32"))
    ap.add_argument("--size", default=env("SIZE", "1258291"), help="value size in bytes")
    ap.add_argument("--repeat", default=env("REPEAT", "3"))
    ap.add_argument("--system-cc", default=env("SYSTEM_CC", ""),
                    help="congestion control for the whole machine during the run (root); default: as it is")
    ap.add_argument("--server-cpus", "--server-cpu", type=cpu_list, default=cpu_list(env("SERVER_CPU", "1")),
                    help="CPU list for kvtier serve, redis-server and Mooncake's processes (default 1)")
    ap.add_argument("--gen-cpus", "--gen-cpu", type=cpu_list, default=cpu_list(env("GEN_CPU", "0")),
                    help="CPU list for the generators (default 0)")
    ap.add_argument("--note", type=int, choices=(0, 1), default=int(env("NOTE", "1")),
                    help="1: write the note, its record and notes/README.md's table; 0: records only")
    ap.add_argument("--note-path", default=env("NOTE_PATH", "notes/026-comparisons"))
    ap.add_argument("--server-malloc-conf", default=env("SERVER_MALLOC_CONF", ""),
                    help="_RJEM_MALLOC_CONF for kvtier serve only")
    ap.add_argument("--peers", default=env("PEERS", ",".join(PEERS)),
                    help="the competitors spawned beside kvtier: redis, mooncake or both (default both)")
    ap.add_argument("--kvtier", type=Path, default=None,
                    help="the binary to measure (default $KVTIER_BIN, else target/release/kvtier, built first)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan (commands, placement) and run nothing")
    return ap


def check(a: argparse.Namespace, ap: argparse.ArgumentParser) -> list[str]:
    peers = [p for p in a.peers.split(",") if p]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        ap.error(f"unknown peers {unknown} (known: {', '.join(PEERS)})")
    overlap = sorted(set(a.server_cpus) & set(a.gen_cpus))
    if overlap:
        ap.error(f"--server-cpus and --gen-cpus share CPUs {cpu_text(overlap)}: the generators would "
                 "measure themselves against the server")
    usable = os.sched_getaffinity(0)
    missing = sorted((set(a.server_cpus) | set(a.gen_cpus)) - usable)
    if missing and not a.dry_run:
        ap.error(f"CPUs {cpu_text(missing)} are not usable here (this process may use {cpu_text(sorted(usable))})")
    return peers


def bench_command(binary: Path, grpc: str, workload: str, a: argparse.Namespace, peers: list[str]) -> list[str]:
    return [str(binary), "bench", "--target", f"grpc://{grpc}", "--workload", workload, "--value-size", a.size,
            "--concurrency", a.concurrency, "--duration", a.duration, "--warmup", a.warmup, "--repeat", a.repeat,
            "--peer", ",".join(f"{p}://spawn" for p in peers), "--peer-tool", "--peer-cpus",
            cpu_text(a.server_cpus), "--probe", "--out", str(a.out / workload)]


def rerun_command(a: argparse.Namespace) -> str:
    """The note's re-run command: every setting spelled out, so a later default changes nothing."""
    cmd = ["python3", "scripts/bench-data-plane.py", str(a.out), "--duration", a.duration, "--warmup", a.warmup,
           "-c", a.concurrency, "--size", a.size, "--repeat", a.repeat, "--server-cpus", cpu_text(a.server_cpus),
           "--gen-cpus", cpu_text(a.gen_cpus), "--peers", a.peers, "--note-path", a.note_path]
    cmd += ["--system-cc", a.system_cc] if a.system_cc else []
    cmd += ["--server-malloc-conf", a.server_malloc_conf] if a.server_malloc_conf else []
    return shlex.join(cmd)


def run_workloads(binary: Path, a: argparse.Namespace, peers: list[str]) -> None:
    env_line = f"_RJEM_MALLOC_CONF={a.server_malloc_conf}\n"
    versions = ",".join(["redis-server", "redis-benchmark"] * ("redis" in peers) + ["mooncake"] * ("mooncake" in peers))
    gen = set(a.gen_cpus)
    for workload in ("read", "write"):
        (a.out / "server-env.txt").write_text(env_line)
        srv = kvtier_server(binary, ["--data-listen", "auto", "--memory-capacity", "2GiB"], cpus=a.server_cpus,
                            env={"_RJEM_MALLOC_CONF": a.server_malloc_conf or None})
        try:
            print(f"== {workload}: kvtier serve (pid {srv.pid}) on CPUs {cpu_text(a.server_cpus)}, "
                  f"gRPC {srv.grpc}", flush=True)
            subprocess.run(bench_command(binary, srv.grpc, workload, a, peers), check=True,
                           preexec_fn=lambda: os.sched_setaffinity(0, gen))
        finally:
            srv.stop()
        stamp([str(a.out / workload / "record.json"), "--versions", versions, "--kvtier", str(binary)])


def main() -> int:
    os.chdir(ROOT)  # OUT, NOTE_PATH and the binary are relative to the repository root, as they always were
    ap = parser()
    a = ap.parse_args()
    peers = check(a, ap)
    binary = a.kvtier or release_binary()
    build = a.kvtier is None and "KVTIER_BIN" not in os.environ
    plan = [
        *(["cargo build --release -q -p kvtier"] if build else []),
        *(["scripts/setup-mooncake.sh"] if "mooncake" in peers and "KVTIER_MOONCAKE_PYTHON" not in os.environ
          else []),
        *([f"congestion control for every system: {a.system_cc} (restored after)"] if a.system_cc else []),
        *(f"kvtier serve pinned to {cpu_text(a.server_cpus)}; " + shlex.join(bench_command(
            binary, "127.0.0.1:PORT", w, a, peers)) + f"  # on CPUs {cpu_text(a.gen_cpus)}"
          for w in ("read", "write")),
        *([f"scripts/note-comparisons.py {a.out} --note {a.note_path}"] if a.note else []),
    ]
    if a.dry_run:
        print("\n".join(["plan:", *plan, f"re-run: {rerun_command(a)}"]))
        return 0
    if build:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "kvtier"], check=True)
    if "mooncake" in peers and "KVTIER_MOONCAKE_PYTHON" not in os.environ:
        subprocess.run(["scripts/setup-mooncake.sh"], check=True)
        mooncake_python()  # fails here, not mid-run, if it is still missing
    a.out.mkdir(parents=True, exist_ok=True)
    orig_cc = CC_PATH.read_text().strip()
    try:
        if a.system_cc:
            CC_PATH.write_text(a.system_cc + "\n")
        print(f"congestion control for every system: {CC_PATH.read_text().strip()}", flush=True)
        run_workloads(binary, a, peers)
    finally:
        if CC_PATH.read_text().strip() != orig_cc:
            CC_PATH.write_text(orig_cc + "\n")
    if a.note:
        subprocess.run([sys.executable, "scripts/note-comparisons.py", str(a.out), "--note", a.note_path,
                        "--command", rerun_command(a)], check=True)
    print(f"records under {a.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
