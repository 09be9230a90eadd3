#!/usr/bin/env python3
"""notes/007-allocator: 1.2 MB writes over the data plane with the server on
glibc malloc (default settings), glibc with large-buffer tunables, and
jemalloc (the default build), alternated in one run, ``--rounds`` times.

Binaries: built as the note built them, unless given. ``cargo build --release
-p kvtier --no-default-features`` is the glibc server (the system allocator),
the default build the jemalloc one; the default build is built last, so
target/release/kvtier is left as the default build. Either binary can be
passed instead (``--glibc-bin``, ``--jemalloc-bin``); both are copied to
WORK/bin, and the jemalloc one is also the load generator, as it always was.

Each round starts a fresh ``kvtier serve`` per variant through
``perf.services.kvtier_server`` (3 GiB memory tier, data plane on, started
pinned to ``--server-cpu``: its runtime sizes itself to that CPU, notes/028)
and runs ``kvtier bench --workload write --value-size 1.2MB`` pinned to
``--gen-cpu``; variants alternate A B C, C B A, ... (``perf.ab.alternate``)
so a slow phase of the shared machine falls on all of them. Each variant's
write throughput, p50 and p99 are the medians over the rounds; a round
outside 0.75-1.33x the throughput median is listed under ``outliers``
(``perf.ab.summarize``), never dropped.

Usage: scripts/bench-allocator.py [flags]  (scripts/bench-allocator.sh, the
command notes/007 names, execs it). Flags default to the environment
variables the shell version read: ROUNDS=2 DURATION=3s C=1,8
OUT=out/007-allocator (the work directory: binaries, server logs, kvtier
bench's records); SERVER_CPU=1 GEN_CPU=0. The perf record goes to ``--out``
(default notes/007-allocator.json).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from _perf import ROOT

from perf import alternate, header, order, summarize, tool_version, versions, write_record
from perf.services import kvtier_server

#: notes/006's workaround: glibc serves buffers above mmap_threshold with a
#: fresh mapping each time and trims freed memory above trim_threshold.
TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
#: variant -> (binary, GLIBC_TUNABLES); None removes any inherited setting.
VARIANTS: dict[str, tuple[str, str | None]] = {
    "glibc": ("glibc", None),
    "glibc-tunables": ("glibc", TUNABLES),
    "jemalloc": ("jemalloc", None),
}
BUILDS = {
    "glibc": ["cargo", "build", "--release", "-q", "-p", "kvtier", "--no-default-features"],
    "jemalloc": ["cargo", "build", "--release", "-q", "-p", "kvtier"],
}
SERVER_ARGS = ["--memory-capacity", "3GiB"]
ENV_KNOBS = ("ROUNDS", "DURATION", "C", "OUT", "SERVER_CPU", "GEN_CPU")


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=int(env("ROUNDS", "2")), help="$ROUNDS, default 2")
    ap.add_argument("--duration", default=env("DURATION", "3s"), help="per step, $DURATION, default 3s")
    ap.add_argument("-c", "--concurrency", default=env("C", "1,8"), help="$C, default 1,8")
    ap.add_argument("--work-dir", type=Path, default=Path(env("OUT", "out/007-allocator")),
                    help="binaries, server logs and kvtier bench's records ($OUT, default out/007-allocator)")
    ap.add_argument("--out", type=Path, default=Path("notes/007-allocator.json"), help="the perf record")
    ap.add_argument("--glibc-bin", type=Path, help="the --no-default-features build (default: build it)")
    ap.add_argument("--jemalloc-bin", type=Path, help="the default build (default: build it)")
    ap.add_argument("--server-cpu", type=int, default=int(env("SERVER_CPU", "1")))
    ap.add_argument("--gen-cpu", type=int, default=int(env("GEN_CPU", "0")))
    ap.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    return ap


def bench_command(generator: Path, grpc: str, out: Path, a: argparse.Namespace) -> list[str]:
    return [str(generator), "bench", "--target", f"grpc://{grpc}", "--workload", "write", "--value-size", "1.2MB",
            "--concurrency", a.concurrency, "--duration", a.duration, "--warmup", "1s", "-q", "--out", str(out)]


def build_plan(a: argparse.Namespace, bins: dict[str, Path]) -> list[str]:
    """What :func:`prepare_binaries` will do, as commands."""
    plan = []
    if a.glibc_bin is None:
        plan.append(shlex.join(BUILDS["glibc"]) + f" && cp target/release/kvtier {bins['glibc']}")
    if a.jemalloc_bin is None or a.glibc_bin is None:
        plan.append(shlex.join(BUILDS["jemalloc"])
                    + (f" && cp target/release/kvtier {bins['jemalloc']}" if a.jemalloc_bin is None else ""))
    plan += [f"cp {p} {bins[k]}" for k, p in (("glibc", a.glibc_bin), ("jemalloc", a.jemalloc_bin)) if p]
    return plan


def prepare_binaries(a: argparse.Namespace, bins: dict[str, Path]) -> None:
    """Builds what was not given (glibc first, so the default build is the
    one left in target/release), then copies both to WORK/bin."""
    given = {"glibc": a.glibc_bin, "jemalloc": a.jemalloc_bin}
    built = ROOT / "target" / "release" / "kvtier"
    (a.work_dir / "bin").mkdir(parents=True, exist_ok=True)
    if given["glibc"] is None:
        subprocess.run(BUILDS["glibc"], check=True)
        shutil.copy2(built, bins["glibc"])
    if given["jemalloc"] is None or given["glibc"] is None:
        subprocess.run(BUILDS["jemalloc"], check=True)
        if given["jemalloc"] is None:
            shutil.copy2(built, bins["jemalloc"])
    for kind, path in given.items():
        if path is not None:
            if not path.is_file():
                raise SystemExit(f"--{kind}-bin {path}: no such file")
            shutil.copy2(path, bins[kind])


def run_one(variant: str, rnd: int, a: argparse.Namespace, bins: dict[str, Path]) -> dict[str, dict[str, float]]:
    """One server, one `kvtier bench`: {"c=N": {ops_per_s, p50_us, p99_us}}."""
    binary, tunables = VARIANTS[variant]
    out = a.work_dir / f"{variant}-{rnd}"
    shutil.rmtree(out, ignore_errors=True)  # a stale record.json must not stand in for this run's
    srv = kvtier_server(bins[binary], args=SERVER_ARGS, cpus=[a.server_cpu], env={"GLIBC_TUNABLES": tunables})
    print(f"round {rnd}: {variant} (pid {srv.pid}, CPU {a.server_cpu}, GLIBC_TUNABLES={tunables or 'unset'})",
          flush=True)
    try:
        if not srv.ready.get("data"):
            raise SystemExit(f"{variant}: the server has no data plane ({srv.ready}); notes/007 measures it")
        gen = {a.gen_cpu}
        subprocess.run(bench_command(bins["jemalloc"], srv.grpc, out, a), check=True, stdout=subprocess.DEVNULL,
                       preexec_fn=lambda: os.sched_setaffinity(0, gen))
    finally:
        (a.work_dir / f"{variant}-{rnd}.server.log").write_text(srv.stderr_text())
        srv.stop()
    rec = json.loads((out / "record.json").read_text())
    steps: dict[str, dict[str, float]] = {}
    for st in rec["steps"]:
        op = st["ops"]["write"]
        e2e = op["latency_us"]["e2e"]
        steps[f"c={st['mode']['concurrency']}"] = {
            "ops_per_s": op["throughput_ops_s"], "p50_us": e2e["p50"], "p99_us": e2e["p99"]}
    return steps


def summary(by_variant: dict[str, list[dict[str, dict[str, float]]]]) -> dict[str, Any]:
    """notes/007's structure: variant -> "c=N" -> medians and every round's run
    (in round order), plus the throughput outliers (perf.ab's form: ``repeat``
    is the 0-based index into ``runs``)."""
    res: dict[str, Any] = {}
    for variant in VARIANTS:
        per_c: dict[str, list[dict[str, float]]] = {}
        for steps in by_variant[variant]:
            for c, run in steps.items():
                per_c.setdefault(c, []).append(run)
        res[variant] = {}
        for c, runs in per_c.items():
            ops = summarize([r["ops_per_s"] for r in runs])
            res[variant][c] = {
                "median_ops_per_s": ops.median,
                "median_p50_us": summarize([r["p50_us"] for r in runs]).median,
                "median_p99_us": summarize([r["p99_us"] for r in runs]).median,
                "runs": runs,
                "outliers": ops.as_dict()["outliers"],
            }
    return res


def main() -> int:
    os.chdir(ROOT)  # OUT, --out and the binaries are relative to the repository root, as they always were
    ap = parser()
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if a.server_cpu == a.gen_cpu:
        ap.error("--server-cpu and --gen-cpu must differ: the generator would measure itself against the server")
    missing = {a.server_cpu, a.gen_cpu} - os.sched_getaffinity(0)
    if missing and not a.dry_run:
        ap.error(f"CPUs {sorted(missing)} are not usable here")
    bins = {k: a.work_dir / "bin" / f"kvtier-{k}" for k in ("glibc", "jemalloc")}
    if a.dry_run:
        plan = build_plan(a, bins)
        for r in range(a.rounds):
            for v in order(list(VARIANTS), r):
                binary, tunables = VARIANTS[v]
                plan.append(f"round {r + 1} {v}: GLIBC_TUNABLES={tunables or '(unset)'} {bins[binary]} serve "
                            f"{shlex.join(SERVER_ARGS)}  # pinned to CPU {a.server_cpu}")
                plan.append("  " + shlex.join(bench_command(bins["jemalloc"], "127.0.0.1:PORT",
                                                            a.work_dir / f"{v}-{r + 1}", a))
                            + f"  # pinned to CPU {a.gen_cpu}")
        print("\n".join(["plan:", *plan, f"record: {a.out}"]))
        return 0
    prepare_binaries(a, bins)
    # Taken before the run: the tree's state is the one measured.
    head = header(env=ENV_KNOBS, versions=versions("kvtier", paths={"kvtier": bins["jemalloc"]},
                                                    known={"kvtier-glibc": tool_version("kvtier", bins["glibc"])}))
    by_variant = alternate(list(VARIANTS), a.rounds, lambda v, r: run_one(v, r + 1, a, bins),
                           log=None)
    results = summary(by_variant)
    write_record(a.out, {
        "settings": {"rounds": a.rounds, "duration": a.duration, "warmup": "1s", "concurrency": a.concurrency,
                     "value_size": "1.2MB", "server_args": SERVER_ARGS, "server_cpu": a.server_cpu,
                     "gen_cpu": a.gen_cpu, "glibc_tunables": TUNABLES,
                     "order": [order(list(VARIANTS), r) for r in range(a.rounds)]},
        "results": results,
    }, head)
    for n, cs in results.items():
        for c, v in cs.items():
            flag = "  outliers: " + summarize([x["ops_per_s"] for x in v["runs"]]).describe(n) if v["outliers"] else ""
            print(f"{n:16s} {c:10s} {v['median_ops_per_s']:8.0f} ops/s  p50 {v['median_p50_us'] / 1000:6.2f} ms  "
                  f"p99 {v['median_p99_us'] / 1000:6.2f} ms{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
