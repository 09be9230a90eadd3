#!/usr/bin/env python3
"""A/B of two revisions on the same machine in the same run: did a change
(a refactor, say) cost performance?

For each revision (BASE and HEAD, default HEAD = the checkout's HEAD) the
script builds, in a detached git worktree under out/ab/, the release `kvtier`
binary and the engine's criterion bench (target dir shared with the checkout,
so dependencies compile once). Then, REPEAT times, alternating A B A B …:

* engine: the criterion bench of kvtier-core (`benches/engine.rs`, in process,
  no network), each benchmark's median;
* data plane: `kvtier serve` of that revision on SERVER_CPU, driven by HEAD's
  `kvtier bench` on GEN_CPU (the same generator for both, so only the server
  differs): 1.2 MB reads and writes of memory-tier hits at c = 1, 8, 32,
  throughput and p99. Both servers run the system's congestion control
  (`server.data_tcp_congestion = ""`: older revisions defaulted to reno).

Ratios are HEAD / BASE of the medians over repeats (for latencies, lower is
better: a ratio < 1 is HEAD faster). Steps where the generator was saturated
are flagged and get no ratio. Every repeat is kept in the record.

Writes the perf record (--record) and, with --note, the note's generated part.

Usage: scripts/bench-ab.py BASE [--head REV] [--repeat 3] [--duration 3s]
         [--record notes/NNN.json] [--note notes/NNN.md] [--skip-engine]
         [--skip-data-plane] [--engine-filter REGEX] [--workloads read,write,lookup]
       scripts/bench-ab.py --render notes/NNN.json --note notes/NNN.md
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _perf import ROOT

from perf import header, order, summarize, versions, write_record
from perf.services import Server, kvtier_server

SIZE = 1258291
CONC = "1,8,32"


def sh(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, **kw).stdout


def rev_sha(rev: str) -> str:
    return sh(["git", "-C", str(ROOT), "rev-parse", rev]).strip()


def build(sha: str, work: Path, engine: bool = True) -> dict[str, Path]:
    """Release kvtier + (if `engine`) the engine bench executable of revision `sha`."""
    tree = work / f"tree-{sha[:10]}"
    out = work / f"bin-{sha[:10]}"
    if (out / "kvtier").exists() and (not engine or (out / "engine-bench").exists()):
        return {"kvtier": out / "kvtier", "engine": out / "engine-bench"}
    if not tree.exists():
        sh(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha])
    env = dict(os.environ, CARGO_TARGET_DIR=str(ROOT / "target"))
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "kvtier"], cwd=tree, env=env, check=True)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "target" / "release" / "kvtier", out / "kvtier")
    if not engine:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        return {"kvtier": out / "kvtier", "engine": out / "engine-bench"}
    msgs = sh(["cargo", "bench", "-q", "-p", "kvtier-core", "--bench", "engine", "--no-run",
               "--message-format=json"], cwd=tree, env=env)
    exe = None
    for line in msgs.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "engine" \
                and m.get("executable"):
            exe = m["executable"]
    if exe is None:
        sys.exit(f"no engine bench executable built for {sha}")
    shutil.copy2(exe, out / "engine-bench")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    return {"kvtier": out / "kvtier", "engine": out / "engine-bench"}


def engine_run(exe: Path, home: Path, filt: str | None = None) -> dict[str, float]:
    """Runs the criterion bench (only benchmarks matching `filt`, a regex,
    when given); median (ns) per benchmark id."""
    if home.exists():
        shutil.rmtree(home)
    env = dict(os.environ, CRITERION_HOME=str(home))
    subprocess.run([str(exe), "--bench", "--noplot", *([filt] if filt else [])], env=env, check=True,
                   stdout=subprocess.DEVNULL, cwd=ROOT / "crates" / "kvtier-core")
    out = {}
    for est in home.rglob("new/estimates.json"):
        bench = json.loads((est.parent / "benchmark.json").read_text())
        out[bench["full_id"]] = json.loads(est.read_text())["median"]["point_estimate"]
    if not out:
        sys.exit(f"criterion wrote no estimates under {home}")
    return out


def start_server(kvtier: Path, cpu: str) -> Server:
    """`kvtier serve` of one revision, started on `cpu` (its runtime sizes
    itself to it), on the system's congestion control (older revisions
    defaulted the data plane to reno)."""
    return kvtier_server(kvtier, ["--data-listen", "auto", "--memory-capacity", "2GiB"],
                         cpus=[int(c) for c in cpu.split(",")], config='[server]\ndata_tcp_congestion = ""\n')


def data_plane_run(server_bin: Path, bench_bin: Path, work: Path, args) -> dict:
    results = {}
    for w in args.workloads.split(","):
        srv = start_server(server_bin, args.server_cpu)
        grpc = srv.grpc
        try:
            out = work / f"dp-{w}"
            if out.exists():
                shutil.rmtree(out)
            subprocess.run(["taskset", "-c", args.gen_cpu, str(bench_bin), "bench", "--target", f"grpc://{grpc}",
                            "--workload", w, "--value-size", str(SIZE), "--concurrency", CONC,
                            "--duration", args.duration, "--warmup", "1s", "--repeat", "1", "--out", str(out)],
                           check=True, stdout=subprocess.DEVNULL)
            rec = json.loads((out / "record.json").read_text())
        finally:
            srv.stop(30)
        for step in rec["steps"]:
            c = step["mode"]["concurrency"]
            op = step["ops"]["lookup" if w == "lookup" else w]
            results[f"{w} c={c}"] = {
                "ops_s": op["throughput_ops_s"],
                "p99_us": op["latency_us"]["e2e"]["p99"],
                "errors": op["errors"],
                "generator_cpu": step["generator_cpu_utilisation"],
                "saturated": any(f.get("kind") == "client_cpu" for f in step.get("flags", []))
                or step["generator_cpu_utilisation"] >= 0.9,
            }
    return results


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", nargs="?")
    ap.add_argument("--render", metavar="RECORD",
                    help="re-render --note from an existing record instead of running")
    ap.add_argument("--head", default="HEAD")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", default="3s")
    ap.add_argument("--server-cpu", default="1")
    ap.add_argument("--gen-cpu", default="0")
    ap.add_argument("--work", default=str(ROOT / "out" / "ab"))
    ap.add_argument("--record")
    ap.add_argument("--note")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--workloads", default="read,write",
                    help="kvtier bench workloads of the data-plane step (read and write go over the "
                         "data plane, lookup over gRPC)")
    ap.add_argument("--skip-data-plane", action="store_true")
    ap.add_argument("--engine-filter", help="criterion filter (regex): only these engine benchmarks")
    args = ap.parse_args()
    if args.render:
        write_note(json.loads(Path(args.render).read_text()), args.note)
        return 0
    if not args.base:
        ap.error("BASE is required unless --render is given")

    base, head = rev_sha(args.base), rev_sha(args.head)
    head_ = header()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bins = {base: build(base, work, not args.skip_engine), head: build(head, work, not args.skip_engine)}
    head_["versions"] = versions("kvtier", paths={"kvtier": bins[head]["kvtier"]})
    runs: dict[str, list] = {base: [], head: []}
    for r in range(args.repeat):
        for sha in order([base, head], r):  # A B, B A, ...
            print(f"repeat {r}: {sha[:10]}", flush=True)
            one: dict[str, Any] = {"repeat": r}
            if not args.skip_engine:
                one["engine_ns"] = engine_run(bins[sha]["engine"], work / f"crit-{sha[:10]}-{r}",
                                              args.engine_filter)
            if not args.skip_data_plane:
                one["data_plane"] = data_plane_run(bins[sha]["kvtier"], bins[head]["kvtier"], work, args)
            runs[sha].append(one)

    engine_rows = []
    if not args.skip_engine:
        ids = sorted(set(runs[base][0]["engine_ns"]) & set(runs[head][0]["engine_ns"]))
        for i in ids:
            b = med([x["engine_ns"][i] for x in runs[base]])
            h = med([x["engine_ns"][i] for x in runs[head]])
            engine_rows.append({"bench": i, "base_ns": b, "head_ns": h, "time_ratio": h / b})
    dp_rows = []
    for k in runs[base][0].get("data_plane", {}):
        bs = [x["data_plane"][k] for x in runs[base]]
        hs = [x["data_plane"][k] for x in runs[head]]
        sat = any(s["saturated"] for s in bs + hs)
        errs = sum(s["errors"] for s in bs + hs)
        row = {
            "step": k,
            "base_ops_s": [s["ops_s"] for s in bs], "head_ops_s": [s["ops_s"] for s in hs],
            "base_p99_us": [s["p99_us"] for s in bs], "head_p99_us": [s["p99_us"] for s in hs],
            "generator_cpu_max": max(s["generator_cpu"] for s in bs + hs),
            "errors": errs,
            "excluded": "generator saturated" if sat else ("errors" if errs else None),
        }
        if not row["excluded"]:
            row["ops_ratio"] = med(row["head_ops_s"]) / med(row["base_ops_s"])
            row["p99_ratio"] = med(row["head_p99_us"]) / med(row["base_p99_us"])
        # Repeats outside 0.75-1.33x their side's median, shown next to the ratio (perf.ab).
        row["outliers"] = [sm.describe(side, " ops/s") for side in ("base", "head")
                           if (sm := summarize(row[f"{side}_ops_s"])).outliers]
        dp_rows.append(row)

    fields = {
        "head_commit": head,
        "base_commit": base,
        "settings": {"repeat": args.repeat, "duration": args.duration, "server_cpu": args.server_cpu,
                     "gen_cpu": args.gen_cpu, "value_size": SIZE, "concurrency": CONC,
                     "workloads": args.workloads},
        "engine": engine_rows,
        "data_plane": dp_rows,
        "runs": runs,
    }
    record = write_record(args.record, fields, head_) if args.record else {**head_, **fields}
    write_note(record, args.note)
    return 0


def write_note(record: dict, note_path: str | None) -> None:
    """Prints the tables; with a note path, replaces what follows the marker
    in that note (the hand-written part above it is kept)."""
    text = render(record)
    print(text)
    if note_path:
        note = Path(note_path)
        marker = "<!-- generated by scripts/bench-ab.py: below this line -->"
        prefix = note.read_text().split(marker)[0] if note.exists() else ""
        note.write_text(prefix + marker + "\n" + text)


def render(rec: dict) -> str:
    head = rec.get("head_commit") or rec["git_commit"]  # git_commit: records before perf's header
    out = [f"Base `{rec['base_commit'][:10]}`, head `{head[:10]}`, {rec['date']}, "
           f"{rec['settings']['repeat']} alternating repeats; `{rec['command']}`.", ""]
    if rec["engine"]:
        out += ["### Engine (criterion, in process): median time per operation", "",
                "| benchmark | base | head | head / base |", "|---|---|---|---|"]
        for r in rec["engine"]:
            out.append(f"| {r['bench']} | {fmt_ns(r['base_ns'])} | {fmt_ns(r['head_ns'])} | {r['time_ratio']:.2f} |")
        ratios = [r["time_ratio"] for r in rec["engine"]]
        out += ["", f"Median time ratio over {len(ratios)} benchmarks: **{med(ratios):.2f}** "
                f"(range {min(ratios):.2f}–{max(ratios):.2f}).", ""]
    if not rec["data_plane"]:
        return "\n".join(out) + "\n"
    out += ["### Data plane (1.2 MB, memory hits; same generator for both servers)", "",
            "| step | base ops/s (repeats) | head ops/s (repeats) | ops/s head / base | p99 head / base |",
            "|---|---|---|---|---|"]
    for r in rec["data_plane"]:
        rat = (f"{r['ops_ratio']:.2f}", f"{r['p99_ratio']:.2f}") if not r["excluded"] else \
            (f"no ratio: {r['excluded']}", "")
        out.append(f"| {r['step']} | {' / '.join(f'{x:.0f}' for x in r['base_ops_s'])} | "
                   f"{' / '.join(f'{x:.0f}' for x in r['head_ops_s'])} | {rat[0]} | {rat[1]} |")
    # Records before perf.ab carry no "outliers".
    flagged = [f"- {r['step']}: {'; '.join(r['outliers'])}" for r in rec["data_plane"] if r.get("outliers")]
    if flagged:
        out += ["", "Repeats outside 0.75–1.33× their median (kept in the medians above):", "", *flagged]
    return "\n".join(out) + "\n"


def fmt_ns(ns: float) -> str:
    return f"{ns / 1000:.2f} µs" if ns >= 1000 else f"{ns:.0f} ns"


if __name__ == "__main__":
    sys.exit(main())
