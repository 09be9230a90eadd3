"""The data-plane comparison as a lent device machine runs it (docs/bench.md,
"On a lent 16-core device"): scripts/device-data-plane.sh's plan, and
scripts/bench-data-plane.py, which it runs there, measuring for real here on a
tiny schedule against the debug binary and Redis.

The device gets one try of a few minutes, so what can be checked before it
is checked here: the plan fits its time, the CPU sets are separate, and the
driver starts, measures, stamps and writes its records."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvtier.server import REPO_ROOT

DEVICE = REPO_ROOT / "scripts" / "device-data-plane.sh"
DRIVER = REPO_ROOT / "scripts" / "bench-data-plane.py"
HEADER = ("date", "commit", "dirty", "machine", "command", "versions")


def device(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(DEVICE), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, stdin=subprocess.DEVNULL)


def test_device_plan_separates_cores_and_fits_the_time():
    p = device("run", "--dry-run", WORK="/tmp/kvtier-device-plan")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    est = int(lines[0].split("estimate ")[1].split(" s")[0])
    assert 0 < est <= 480, lines[0]
    bench = [ln for ln in lines if " bench --target " in ln]
    assert [("--workload read" in ln, "--workload write" in ln) for ln in bench] == [(True, False), (False, True)]
    for ln in bench:
        assert "kvtier serve pinned to 0-7;" in ln and ln.endswith("# on CPUs 8-15"), ln
        assert "--peer redis://spawn,mooncake://spawn --peer-tool --peer-cpus 0-7" in ln, ln
        assert ln.split(";")[1].split()[0] == "/tmp/kvtier-device-plan/bin/kvtier", ln
    # Everything comes from the bundle: nothing is built or installed there.
    assert "cargo build" not in p.stdout and "setup-mooncake" not in p.stdout, p.stdout


def test_device_plan_refuses_what_does_not_fit():
    p = device("run", "--dry-run", DURATION="30s")
    assert p.returncode == 1 and "is over 480 s" in p.stdout, p.stdout + p.stderr
    p = device("run", "--dry-run", SERVER_CPUS="0-8", GEN_CPUS="8-15")
    assert p.returncode != 0 and "share CPUs 8" in p.stderr, p.stdout + p.stderr


def test_driver_measures_stamps_and_writes_records(tmp_path, kvtier_bin: Path):
    assert len(os.sched_getaffinity(0)) > 1, "needs two usable CPUs: one for the server, one for the generators"
    out = tmp_path / "dp"
    p = subprocess.run(
        [sys.executable, str(DRIVER), str(out), "--kvtier", str(kvtier_bin), "--peers", "redis", "--note", "0",
         "-c", "1", "--duration", "300ms", "--warmup", "0s", "--repeat", "1", "--server-cpus", "0", "--gen-cpus", "1"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert (out / "server-env.txt").read_text() == "_RJEM_MALLOC_CONF=\n"
    for workload in ("read", "write"):
        rec = json.loads((out / workload / "record.json").read_text())
        assert list(rec)[:6] == list(HEADER), list(rec)[:6]  # perf.stamp put the header first
        assert rec["versions"]["redis-server"] and rec["versions"]["kvtier"], rec["versions"]
        assert [p["name"].split()[0] for p in rec["peers"]] == ["redis"], rec["peers"]
        assert "--peer-cpus" in rec["command_line"] and rec["command_line"][rec["command_line"].index(
            "--peer-cpus") + 1] == "0", rec["command_line"]
