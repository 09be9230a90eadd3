"""The routing benchmark's short version (``scripts/bench-routing.py --quick``,
docs/serving.md "Cache-aware routing"): two vLLM replicas, each with its own
kvtier node, the nodes one cluster, behind a round-robin router and the
cache-aware router on the engines' KV events and on the engines' and
kvtier's. Real engines, real nodes, vLLM's own client. Checked: every
request served; round-robin uses both replicas; the cache-aware router keeps
conversations where their prefix is, so the engines' own hit rate beats
round-robin's, and the tokens it credited to the engines' caches are what
the engines then reported as prefix-cache hits; with kvtier's events its
index holds blocks of both nodes. TTFT is the benchmark's to compare (a
quick run on CI's two cores is noise).
"""
from __future__ import annotations

import json
import subprocess
import sys

from kvtier.server import REPO_ROOT, find_binary

SCRIPT = REPO_ROOT / "scripts" / "bench-routing.py"


def test_cache_aware_routing_follows_the_engines_and_kvtiers_events(tmp_path):
    out = tmp_path / "routing.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--workdir", str(tmp_path / "run"),
         "--kvtier-bin", str(find_binary())],
        capture_output=True, text=True, timeout=1500, cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rec = json.loads(out.read_text())
    runs = {r["router"]: r for r in rec["runs"]}
    assert set(runs) == {"round-robin", "cache-aware-engine", "cache-aware-kvtier"}
    steps = {name: r["steps"][0] for name, r in runs.items()}
    for name, s in steps.items():
        requests = rec["traces"][s["trace"]]["requests"]
        assert s["completed"] == requests and s["failed"] == 0, (name, s)
    rr, eng, kv = steps["round-robin"], steps["cache-aware-engine"], steps["cache-aware-kvtier"]
    assert len(rr["routed"]) == 2 and min(rr["routed"].values()) >= 1, rr["routed"]
    assert eng["local_hit_rate"] > rr["local_hit_rate"], (eng["local_hit_rate"], rr["local_hit_rate"])
    for s in (eng, kv):
        prompt = s["engine_counters"]["prompt_tokens"]
        credited = s["router_credited"].get("engine", 0)
        hits = s["engine_counters"]["local_hits"]
        assert abs(credited - hits) <= 0.1 * prompt, f"credited {credited} engine tokens, the engines hit {hits}"
        assert all(f["errors"] == 0 for f in s["router_feeds"]), s["router_feeds"]
    sources = kv["router_index"]["sources"]
    nodes = [n for n, src in sources.items() if src["kind"] == "kvtier"]
    assert len(nodes) == 2 and all(sources[n]["blocks"] > 0 for n in nodes), sources
    assert "kvtier" not in json.dumps(eng["router_index"]["sources"]), "engine-only: no kvtier source"
