"""scripts/bench-admission.py (notes/064) on a tiny trace against the debug
binary: it replays both traces under every policy, and the record shows
what the policies are for: ``all`` writes every distinct block down,
``reuse`` and ``tinylfu`` write fewer bytes to both lower tiers."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvtier.server import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "bench-admission.py"


def test_the_admission_replay_runs_and_the_policies_write_less(tmp_path, kvtier_bin: Path):
    out = tmp_path / "admission.json"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--kvtier", str(kvtier_bin), "--users", "3",
         "--turns", "2", "--memory-blocks", "8", "--block-bytes", "65536"],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    rec = json.loads(out.read_text())
    assert list(rec)[:6] == ["date", "commit", "dirty", "machine", "command", "versions"], list(rec)[:6]
    for trace, r in rec["results"].items():
        distinct = rec["traces"][trace]["distinct_blocks"]
        assert r["all"]["disk"]["admitted"] == distinct, (trace, r["all"]["disk"])
        assert r["all"]["object"]["puts"] == distinct, (trace, r["all"]["object"])
        for policy in ("reuse", "tinylfu"):
            for tier in ("disk", "object"):
                assert r[policy][tier]["written_bytes"] < r["all"][tier]["written_bytes"], (trace, policy, tier)
            assert r[policy]["disk"]["deferred"] > 0
        mixed = r["disk-all+object-reuse"]
        assert mixed["disk"]["written_bytes"] == r["all"]["disk"]["written_bytes"], "the disk takes every block"
        assert mixed["object"]["written_bytes"] < r["all"]["object"]["written_bytes"]
        assert r["reuse"]["monthly_cost_usd"]["total"] < r["all"]["monthly_cost_usd"]["total"]
        assert 0 < r["all"]["hit_rate"] <= rec["traces"][trace]["infinite_cache_hit_rate"] + 1e-9
