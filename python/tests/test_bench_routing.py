"""The routing benchmark without engines (scripts/bench-routing.py --dry-run;
docs/serving.md, "Cache-aware routing"): its arguments, the topology it
plans (two kvtier nodes in one cluster with one copy per block, each engine
on its own node, every engine and node publishing KV events, three router
configurations) and the record it writes; its schedule and its summary of
synthetic runs."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO_ROOT, load_script

SCRIPT = REPO_ROOT / "scripts" / "bench-routing.py"


def test_dry_run_plans_the_topology_and_writes_the_record(tmp_path):
    out = tmp_path / "routing.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--quick", "--out", str(out),
                           "--workdir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rec = json.loads(out.read_text())
    for key in ("date", "commit", "dirty", "machine", "command", "versions"):
        assert key in rec, f"the record lacks the header key {key}"
    assert rec["dry_run"] is True and rec["runs"] == []
    assert rec["routers"] == ["round-robin", "cache-aware-engine", "cache-aware-kvtier"]
    assert rec["trace_spec"]["users"] == 3 and rec["trace_spec"]["turns"] == 4
    topo = rec["topology"]
    nodes = topo["nodes"]
    assert len(nodes) == 2
    members = ",".join(f"grpc://{n['name']}" for n in nodes)
    for i, n in enumerate(nodes):
        args = n["args"]
        assert args[args.index("--cluster-nodes") + 1] == members
        assert args[args.index("--cluster-self") + 1] == f"grpc://{n['name']}"
        assert args[args.index("--cluster-replicas") + 1] == "1"
        assert args[args.index("--kv-events") + 1] == n["events"] and n["events"].startswith("tcp://127.0.0.1:")
        assert args[args.index("--kv-events-replay") + 1] == n["replay"] != n["events"]
        assert "--local-listen" in args
        engine = topo["engines"][i]
        assert engine["kv_transfer_config"]["kv_connector_extra_config"]["url"] == n["name"], "its own node"
        events = json.loads(engine["args"][engine["args"].index("--kv-events-config") + 1])
        assert events["enable_kv_cache_events"] and events["publisher"] == "zmq"
        assert events["endpoint"].startswith("ipc://")
        assert events["replay_endpoint"] == events["endpoint"] + "-replay"
    routers = topo["routers"]
    assert routers["round-robin"][:2] == ["--mode", "round-robin"]
    assert "--kvtier-events" not in routers["cache-aware-engine"]
    assert routers["cache-aware-engine"].count("--engine-events") == 2
    kv = routers["cache-aware-kvtier"]
    assert [kv[i + 1] for i, a in enumerate(kv) if a == "--kvtier-events"] == [f"{n['events']},{n['replay']}"
                                                                              for n in nodes]
    assert all(routers["cache-aware-engine"][i + 1].endswith("-replay")
               for i, a in enumerate(routers["cache-aware-engine"]) if a == "--engine-events")
    assert [kv[i + 1] for i, a in enumerate(kv) if a == "--replica-node"] == [n["name"] for n in nodes]
    assert len(rec["schedule"]) == 3 and len({s["trace_set"] for s in rec["schedule"]}) == 3


def test_every_configuration_replays_each_trace_set_once_and_never_one_its_deployment_saw():
    mod = load_script("bench-routing.py", "bench_routing")
    routers = ["a", "b", "c"]
    sched = mod.schedule(routers, 3)
    assert [s["router"] for s in sched if s["repeat"] == 1] == ["c", "b", "a"], "alternating order"
    for k in range(3):
        assert len({s["trace_set"] for s in sched if s["repeat"] == k}) == 3
    for r in routers:
        assert sorted(s["trace_set"] for s in sched if s["router"] == r) == [0, 1, 2]


def _step(rate, p50, p99, failed=0, hit=0.5):
    return {"request_rate": rate, "median_ttft_ms": p50, "p99_ttft_ms": p99, "failed": failed, "hit_rate": hit,
            "local_hit_rate": hit / 2, "external_hit_rate": hit / 2, "hit_vs_bound": hit / 0.7, "router_credited": {"engine": 100.0},
            "kvtier_hits": {"memory": 10.0, "disk": 0.0, "object": 0.0, "remote": 4.0, "misses": 1.0}}


def test_summary_takes_medians_over_repeats_and_the_sustained_rate_against_round_robins_idle_ttft():
    mod = load_script("bench-routing.py", "bench_routing")
    runs = [{"router": "round-robin", "steps": [_step(1, 100, 300), _step(2, 900, 5000)]},
            {"router": "round-robin", "steps": [_step(1, 120, 400), _step(2, 1000, 6000)]},
            {"router": "round-robin", "steps": [_step(1, 110, 350), _step(2, 950, 900)]},
            {"router": "cache-aware-kvtier", "steps": [_step(1, 50, 90), _step(2, 80, 200)]},
            {"router": "cache-aware-kvtier", "steps": [_step(1, 60, 100), _step(2, 70, 300, failed=1)]},
            {"router": "cache-aware-engine", "error": "x", "steps": []}]
    s = mod.summarize(runs, ["round-robin", "cache-aware-engine", "cache-aware-kvtier"], [1, 2])
    assert s["idle_ttft_ms"] == 110
    rr = s["by_router"]["round-robin"]
    assert rr["1"]["median_ttft_ms"] == 110 and rr["2"]["p99_ttft_ms"] == 5000 and rr["1"]["repeats"] == 3
    assert s["sustained_rate"] == {"round-robin": 1.0, "cache-aware-engine": None, "cache-aware-kvtier": 1.0}
    assert s["by_router"]["cache-aware-kvtier"]["2"]["failed"] == 1
    assert s["by_router"]["cache-aware-kvtier"]["1"]["router_credited_tokens"] == {"engine": 100.0}
    assert "| cache-aware-kvtier | 1 | 55 | 95 |" in mod.tables(s)
