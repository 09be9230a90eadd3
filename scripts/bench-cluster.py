#!/usr/bin/env python3
"""Cluster scaling on one machine (docs/cluster.md, notes/021-cluster).

Starts N = 1, 2, 3 `kvtier serve` nodes on loopback as one cluster
(docs/cluster.md; memory only, R = min(2, N)), and drives each with
`kvtier bench`:

* **direct**: `--target grpc://a,grpc://b,...`, the node list: the client
  places every block on its owners itself;
* **single**: `--target grpc://a`, one address: node a forwards what it does
  not own (the path of a load balancer, or of curl).

Read and write workloads in closed loop at each --concurrency, --repeat
repeats each; medians across repeats are compared, min/max kept. Steps the
bench flags (generator saturated, errors) are shown but left out of ratios.
Then, on 3 nodes:

* **lookup round trips**: a lookup workload through one node; node a's
  `kvtier_cluster_forwarded_requests_total{op="lookup"}` over the lookups it
  served = peer calls per lookup;
* **failover**: the read workload through the node list and through one
  address, once undisturbed and once with one of the other nodes SIGKILLed a
  third of the way in; errors, p99 and max of the two.

Writes OUT/record.json (the perf record; notes/021-cluster.json is a copy)
and OUT/summary.md. Every node and the generator share this machine's cores:
the numbers are what N nodes on one box cost and give, not N machines.

  scripts/bench-cluster.py --out out/bench-cluster
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from _perf import ROOT

from perf import header, versions
from perf import record as record_with_header
from perf.services import Server, kvtier_server

_USED: set[int] = set()


def free_port() -> int:
    """A free loopback port this run has not handed out before (the kernel
    may offer a port again once its socket is closed)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _USED:
            _USED.add(port)
            return port


class Node:
    def __init__(self, kvtier: Path, work: Path, i: int):
        self.kvtier, self.work, self.i = kvtier, work / f"node{i}", i
        self.work.mkdir(parents=True, exist_ok=True)
        # The node list names every member before any starts: fixed ports.
        self.grpc = f"127.0.0.1:{free_port()}"
        self.data = f"127.0.0.1:{free_port()}"
        self.http = ""  # the ephemeral port the node reports when ready
        self.server: Server | None = None

    def start(self, members: list[str], a) -> None:
        args = ["--data-listen", self.data, "--memory-capacity", a.memory]
        if len(members) > 1:
            args += ["--cluster-nodes", ",".join(f"grpc://{m}" for m in members),
                     "--cluster-self", f"grpc://{self.grpc}", "--cluster-replicas", str(min(2, len(members)))]
        self.server = kvtier_server(self.kvtier, args, listen=self.grpc)
        self.http = self.server.http or ""

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.running

    def kill(self) -> None:
        """SIGKILL (the failover run's crash), by the node's own PID."""
        if self.server is not None:
            if self.server.running:
                os.kill(self.server.pid, signal.SIGKILL)
            self.server.stop()
            self.server = None

    def metric(self, name: str, **labels: str) -> float:
        body = urllib.request.urlopen(f"http://{self.http}/metrics", timeout=10).read().decode()
        total = 0.0
        for line in body.splitlines():
            if not line.startswith(name + "{"):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def bench(kvtier: Path, targets: list[str], workload: str, out: Path, a, duration: str | None = None,
          concurrency: str | None = None, repeat: int | None = None) -> dict:
    if out.exists():
        shutil.rmtree(out)
    cmd = [str(kvtier), "bench", "--target", ",".join(f"grpc://{t}" for t in targets),
           "--workload", workload, "--value-size", a.value_size,
           "--concurrency", concurrency or a.concurrency, "--duration", duration or a.duration,
           "--warmup", a.warmup, "--repeat", str(repeat or a.repeat), "--quiet", "--out", str(out)]
    log = open(out.parent / f"{out.name}.log", "w")
    p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise SystemExit(f"bench failed ({p.returncode}): {' '.join(cmd)}\n{(out.parent / f'{out.name}.log').read_text()[-3000:]}")
    return json.loads((out / "record.json").read_text())


def steps(rec: dict, op: str) -> list[dict]:
    out = []
    for s in rec["steps"]:
        o = s["ops"][op]
        ar = o["across_repeats"]
        if ar is None:  # one repeat: its own numbers
            one = {"median": o["throughput_ops_s"], "min": o["throughput_ops_s"], "max": o["throughput_ops_s"]}
            p99 = o["latency_us"]["e2e"]["p99"]
            ar = {"throughput_ops_s": one, "p99_us": {"median": p99, "min": p99, "max": p99}}
        out.append({
            "concurrency": s["mode"]["concurrency"],
            "ops_s": ar["throughput_ops_s"]["median"],
            "ops_s_min": ar["throughput_ops_s"]["min"],
            "ops_s_max": ar["throughput_ops_s"]["max"],
            "p99_ms": ar["p99_us"]["median"] / 1e3,
            "p99_ms_min": ar["p99_us"]["min"] / 1e3,
            "p99_ms_max": ar["p99_us"]["max"] / 1e3,
            "max_ms": o["latency_us"]["e2e"]["max"] / 1e3,
            "errors": o["errors"],
            "ops": o["ops"],
            "generator_cpu": s["generator_cpu_utilisation"],
            "flags": s["flags"],
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvtier", default=str(ROOT / "target" / "release" / "kvtier"))
    ap.add_argument("--nodes", default="1,2,3")
    ap.add_argument("--workloads", default="read,write")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--duration", default="3s")
    ap.add_argument("--warmup", default="1s")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--value-size", default="1.2MB")
    ap.add_argument("--memory", default="1GiB")
    ap.add_argument("--skip-failover", action="store_true")
    ap.add_argument("--out", default="out/bench-cluster")
    ap.add_argument("--render", metavar="RECORD", help="recompute the analysis and summary of a record, run nothing")
    a = ap.parse_args()
    if a.render:
        rec = json.loads(Path(a.render).read_text())
        rec.setdefault("placement_choice", placement_choice())
        rec["analysis"] = analyse(rec)
        Path(a.render).write_text(json.dumps(rec, indent=1) + "\n")
        print(summary(rec))
        return
    kvtier = Path(a.kvtier)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    head = header(versions=versions("kvtier", paths={"kvtier": kvtier}))
    record = record_with_header({
        "method": (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "settings": {k: getattr(a, k) for k in ("nodes", "workloads", "concurrency", "duration", "warmup",
                                                  "repeat", "value_size", "memory")},
        "scaling": [],
    }, head)
    try:
        for n in [int(x) for x in a.nodes.split(",")]:
            nodes = [Node(kvtier, work / f"n{n}", i) for i in range(n)]
            members = [x.grpc for x in nodes]
            for x in nodes:
                x.start(members, a)
            try:
                for wl in a.workloads.split(","):
                    paths = [("single", members[:1])] + ([("direct", members)] if n > 1 else [])
                    for path, targets in paths:
                        rec = bench(kvtier, targets, wl, out / f"n{n}-{wl}-{path}", a)
                        record["scaling"].append({"nodes": n, "workload": wl, "path": path,
                                                  "steps": steps(rec, wl)})
                        print(f"{n} node(s) {wl} {path}: " + ", ".join(
                            f"c={s['concurrency']} {s['ops_s']:.0f}/s p99 {s['p99_ms']:.1f} ms"
                            for s in record["scaling"][-1]["steps"]), flush=True)
                if n == 3:
                    record["lookup_round_trips"] = lookup_round_trips(kvtier, nodes, out, a)
                    if not a.skip_failover:
                        record["failover"] = failover(kvtier, nodes, members, out, a)
            finally:
                for x in nodes:
                    x.kill()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record["placement_choice"] = placement_choice()
    record["analysis"] = analyse(record)
    (out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out / 'record.json'}")
    (out / "summary.md").write_text(summary(record))
    print(summary(record))


def lookup_round_trips(kvtier: Path, nodes: list[Node], out: Path, a) -> dict:
    a0 = nodes[0]
    before = (a0.metric("kvtier_cluster_forwarded_requests_total", op="lookup"),
              a0.metric("kvtier_requests_total", op="lookup"))
    rec = bench(kvtier, [a0.grpc], "lookup", out / "n3-lookup-single", a, concurrency="8", repeat=1)
    after = (a0.metric("kvtier_cluster_forwarded_requests_total", op="lookup"),
             a0.metric("kvtier_requests_total", op="lookup"))
    served = after[1] - before[1]
    return {
        "lookups_served": served,
        "peer_lookups": after[0] - before[0],
        "peer_calls_per_lookup": (after[0] - before[0]) / served if served else None,
        # The bench's lookup workload asks for its whole preloaded chain
        # (crates/kvtier-bench/src/workloads/mod.rs).
        "blocks_per_lookup": 64,
        "steps": steps(rec, "lookup"),
    }


def failover(kvtier: Path, nodes: list[Node], members: list[str], out: Path, a) -> list[dict]:
    """The read workload for 9 s at c=8: undisturbed, then with the last
    node SIGKILLed 3 s in (restarted between runs)."""
    res = []
    for path, targets in (("direct", members), ("single", members[:1])):
        for kill in (False, True):
            victim = nodes[-1]
            if not victim.running:
                victim.kill()  # reaps a node killed in the previous run
                victim.start(members, a)
            killer = None
            if kill:
                def later(v=victim):
                    time.sleep(1.0 + 3.0)  # warm-up + a third of the run
                    v.kill()
                import threading
                killer = threading.Thread(target=later)
                killer.start()
            rec = bench(kvtier, targets, "read", out / f"failover-{path}-{'kill' if kill else 'calm'}", a,
                        duration="9s", concurrency="8", repeat=1)
            if killer:
                killer.join()
            s = steps(rec, "read")[0]
            res.append({"path": path, "killed": kill, **s})
            print(f"failover {path} kill={kill}: {s['ops_s']:.0f}/s p99 {s['p99_ms']:.1f} ms "
                  f"max {s['max_ms']:.1f} ms errors {s['errors']}", flush=True)
    return res


def analyse(r: dict) -> dict:
    """Ratios between medians, only for steps nobody flagged."""
    by = {(e["nodes"], e["workload"], e["path"]): {s["concurrency"]: s for s in e["steps"]} for e in r["scaling"]}
    out: dict = {"per_node_efficiency": [], "single_over_direct": []}
    for (n, wl, path), st in by.items():
        base = by.get((1, wl, "single"), {})
        for c, s in st.items():
            b = base.get(c)
            if b and not s["flags"] and not b["flags"]:
                out["per_node_efficiency"].append({"nodes": n, "workload": wl, "path": path, "concurrency": c,
                                                   "speedup": s["ops_s"] / b["ops_s"],
                                                   "per_node": s["ops_s"] / b["ops_s"] / n})
        if path == "single" and (n, wl, "direct") in by:
            for c, s in st.items():
                d = by[(n, wl, "direct")].get(c)
                if d and not s["flags"] and not d["flags"]:
                    out["single_over_direct"].append({"nodes": n, "workload": wl, "concurrency": c,
                                                      "throughput": s["ops_s"] / d["ops_s"],
                                                      "p99": s["p99_ms"] / d["p99_ms"]})
    out["capacity"] = capacity(r, by)
    return out


TOKENS_PER_BLOCK = 128
SLOS_MS = (10.0, 50.0)
TARGET_TOKENS_S = 1_000_000


def capacity(r: dict, by: dict) -> list[dict]:
    """Seed 001's "Servers Needed = Target_Throughput / Per_Server_Capacity",
    from this run: per-server capacity is one node's best tokens/s among
    unflagged steps whose median p99 meets the SLO, times the cluster's work
    efficiency E = (3 nodes' ops/s) / (1 node's ops/s) at the same
    concurrency with every node on the same cores (the share of the machine
    that still serves requests rather than forwarding and replicating;
    median over concurrencies). One node per machine is assumed to get what
    the single node got here."""
    out = []
    for wl in r["settings"]["workloads"].split(","):
        one = by.get((1, wl, "single"), {})
        for path in ("direct", "single"):
            three = by.get((3, wl, path), {})
            effs = [three[c]["ops_s"] / one[c]["ops_s"] for c in three
                    if c in one and not three[c]["flags"] and not one[c]["flags"]]
            if not effs:
                continue
            e = statistics.median(effs)
            for slo in SLOS_MS:
                ok = [s for s in one.values() if not s["flags"] and s["p99_ms"] <= slo]
                if not ok:
                    continue
                best = max(ok, key=lambda s: s["ops_s"])
                per_server = best["ops_s"] * TOKENS_PER_BLOCK * e
                out.append({"workload": wl, "path": path, "p99_slo_ms": slo, "efficiency": e,
                            "single_node_tokens_s": best["ops_s"] * TOKENS_PER_BLOCK,
                            "at_concurrency": best["concurrency"], "per_server_tokens_s": per_server,
                            "target_tokens_s": TARGET_TOKENS_S,
                            "servers_needed": -(-TARGET_TOKENS_S // per_server) if per_server else None})
    return out


def placement_choice(nodes: int = 3, replicas: int = 2, chains: int = 2000, length: int = 64) -> list[dict]:
    """Per-block placement against chain segments of S blocks (a segment's
    owners are its first block's), over random 64-block chains, with the
    placement function itself (python/kvtier/keys.py): how evenly blocks
    spread (busiest node's share over the mean) and how many other nodes one
    lookup through a node must ask (mean; they are asked in parallel)."""
    from kvtier.keys import owners  # the SDK's copy of the server's placement (on sys.path through _perf)

    names = [f"10.0.0.{i}:50051" for i in range(nodes)]
    out = []
    for seg in (1, 8, 16, 64):
        load = {n: 0 for n in names}
        asked, hot = [], []
        for c in range(chains):
            keys = [hashlib.sha256(f"{c}/{i}".encode()).digest() for i in range(length)]
            peers = set()
            mine = {n: 0 for n in names}
            for i in range(len(keys)):
                own = owners(names, "ns", keys[i - i % seg], replicas)
                for n in own:
                    load[n] += 1
                    mine[n] += 1
                if names[0] not in own:
                    peers.add(own[0])
            asked.append(len(peers))
            hot.append(max(mine.values()) / (sum(mine.values()) / nodes))
        mean = sum(load.values()) / nodes
        out.append({"segment_blocks": seg, "busiest_over_mean": max(load.values()) / mean,
                    "one_chain_busiest_over_mean": statistics.mean(hot),
                    "peers_asked_per_lookup": statistics.mean(asked)})
    return out


def flag_names(flags: list) -> list[str]:
    """The bench's step flags by kind (saturated generator, Little's law off, ...)."""
    return [f["kind"] if isinstance(f, dict) else str(f) for f in flags]


def summary(r: dict) -> str:
    commit = r.get("commit") or r["git_commit"]
    cores = r["machine"].get("cores", r["machine"].get("cpus"))
    lines = ["# Cluster scaling on one machine", "", f"{r['date']}, commit {commit[:10]}, "
             f"{cores} CPUs; `{r['command']}`", "",
             "| nodes | workload | path | c | ops/s (min–max) | p99 ms (min–max) | errors | gen CPU | flags |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in r["scaling"]:
        for s in e["steps"]:
            lines.append(f"| {e['nodes']} | {e['workload']} | {e['path']} | {s['concurrency']} | "
                         f"{s['ops_s']:.0f} ({s['ops_s_min']:.0f}–{s['ops_s_max']:.0f}) | "
                         f"{s['p99_ms']:.1f} ({s['p99_ms_min']:.1f}–{s['p99_ms_max']:.1f}) | {s['errors']} | "
                         f"{s['generator_cpu']:.2f} | {', '.join(flag_names(s['flags']))} |")
    an = r["analysis"]
    lines += ["", "Speed-up over 1 node (median ops/s; unflagged steps):", "",
              "| nodes | workload | path | c | speed-up | per node |", "|---|---|---|---|---|---|"]
    for x in an["per_node_efficiency"]:
        lines.append(f"| {x['nodes']} | {x['workload']} | {x['path']} | {x['concurrency']} | "
                     f"{x['speedup']:.2f} | {x['per_node']:.2f} |")
    lines += ["", "Single address over direct (node list):", "", "| nodes | workload | c | throughput | p99 |",
              "|---|---|---|---|---|"]
    for x in an["single_over_direct"]:
        lines.append(f"| {x['nodes']} | {x['workload']} | {x['concurrency']} | {x['throughput']:.2f} | {x['p99']:.2f} |")
    if an.get("capacity"):
        lines += ["", f"Servers needed for {TARGET_TOKENS_S:,} tokens/s (seed 001's formula; per-server capacity = "
                  "1 node's best tokens/s within the p99 SLO × the cluster's work efficiency E on shared cores):", "",
                  "| workload | path | p99 SLO | 1-node tokens/s (c) | E | per server | servers |",
                  "|---|---|---|---|---|---|---|"]
        for x in an["capacity"]:
            lines.append(f"| {x['workload']} | {x['path']} | {x['p99_slo_ms']:.0f} ms | "
                         f"{x['single_node_tokens_s']:,.0f} ({x['at_concurrency']}) | {x['efficiency']:.2f} | "
                         f"{x['per_server_tokens_s']:,.0f} | {x['servers_needed']:.0f} |")
    if "placement_choice" in r:
        lines += ["", "Placement by block or by chain segment (3 nodes, R=2, 2,000 random 64-block chains):", "",
                  "| segment (blocks) | busiest node / mean, all chains | busiest node / mean, one chain (a hot prefix) "
                  "| peers one lookup asks |", "|---|---|---|---|"]
        for x in r["placement_choice"]:
            lines.append(f"| {x['segment_blocks']} | {x['busiest_over_mean']:.3f} | "
                         f"{x['one_chain_busiest_over_mean']:.2f} | {x['peers_asked_per_lookup']:.2f} |")
    if "lookup_round_trips" in r:
        lr = r["lookup_round_trips"]
        lines += ["", f"Lookups through one node of 3: {lr['peer_lookups']:.0f} peer calls for "
                  f"{lr['lookups_served']:.0f} lookups = {lr['peer_calls_per_lookup']:.2f} per lookup "
                  "(parallel: one round trip)."]
    if "failover" in r:
        lines += ["", "| failover path | killed | ops/s | p99 ms | max ms | errors |", "|---|---|---|---|---|---|"]
        for f in r["failover"]:
            lines.append(f"| {f['path']} | {f['killed']} | {f['ops_s']:.0f} | {f['p99_ms']:.1f} | "
                         f"{f['max_ms']:.1f} | {f['errors']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
