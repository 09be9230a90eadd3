"""scripts/bench-plugin-loads.py (notes/060) on a tiny schedule against the
debug binary: it starts the server, runs every variant (floors, the SDK's
calls and the LMCache and SGLang plugins' loads on both transports), checks
the loaded bytes, counts reads through new ``bytes``, and writes a record
with the header. The numbers of a debug build mean nothing; the run does."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvtier.server import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "bench-plugin-loads.py"


def test_the_plugin_loads_bench_runs_and_writes_its_record(tmp_path, kvtier_bin: Path):
    out = tmp_path / "plugin-loads.json"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--kvtier", str(kvtier_bin), "--repeat", "2",
         "--blocks", "16", "--sizes", "1.2MB"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    rec = json.loads(out.read_text())
    assert list(rec)[:6] == ["date", "commit", "dirty", "machine", "command", "versions"], list(rec)[:6]
    r = rec["results"]["1.2MB"]
    calls = ("read_into", "read-into-sizes", "read-into", "lmcache", "sglang")
    assert set(r) == {"memcpy", "tcp-loopback", "targets"} | {f"{c}-{t}" for c in calls for t in ("local", "tcp")}
    assert "peer_check_cost" not in r, "no A/B without --ab-binary"
    for t in ("local", "tcp"):
        for c in ("read_into", "read-into-sizes", "lmcache", "sglang"):
            assert r[f"{c}-{t}"]["native_bytes_reads"] == 0, (c, t)
        assert r[f"read-into-{t}"]["native_bytes_reads"] == 2, "the call without sizes reads through bytes"
    assert all(len(v["seconds"]) == 2 for k, v in r.items() if k != "targets")


def test_the_peer_check_ab_runs_a_second_server(tmp_path, kvtier_bin: Path):
    """``--ab-binary``: a second server (here the same binary: the plumbing,
    not the figure) holds the prefix, its loads alternate with the rest, and
    the record carries the checks' cost and its target."""
    out = tmp_path / "ab.json"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--kvtier", str(kvtier_bin), "--repeat", "1",
         "--blocks", "8", "--sizes", "1.2MB", "--ab-binary", str(kvtier_bin)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    rec = json.loads(out.read_text())
    assert rec["ab_binary"] == str(kvtier_bin)
    r = rec["results"]["1.2MB"]
    for c in ("read_into", "read-into-sizes"):
        assert r[f"{c}-nocheck"]["native_bytes_reads"] == 0, c
        assert isinstance(r["peer_check_cost"][c], float), r["peer_check_cost"]
        assert f"peer checks cost {c} < 2 %" in r["targets"]
