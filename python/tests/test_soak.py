"""The soak (``scripts/soak.py``, docs/durability.md "A soak with faults"):
its checker and schedule on their own, its black-hole proxy against a real
socket, then a two-minute run of the real thing (kvtier release build, MinIO,
a tmpfs it mounts: root) that must pass and must have injected every fault.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from perf.soak.checker import Ledger, digest  # noqa: E402
from perf.soak.faults import BlackHoleProxy  # noqa: E402
from perf.soak.schedule import FAULT_KINDS, MIN_DURATION_S, plan  # noqa: E402


def _ledger(*items: tuple[bytes, bytes, bool]) -> Ledger:
    led = Ledger()
    for key, payload, acked in items:
        led.attempt(key, digest(payload))
        if acked:
            led.acknowledge(key)
    return led


def test_an_acknowledged_key_the_final_read_misses_is_lost():
    led = _ledger((b"a" * 32, b"one", True), (b"b" * 32, b"two", True), (b"c" * 32, b"three", False))
    v = led.final([(b"a" * 32, digest(b"one")), (b"b" * 32, None)])
    assert (v.acknowledged, v.lost, v.corrupt) == (2, 1, 0)
    assert v.lost_keys == [(b"b" * 32).hex()]
    # A key the final read left out entirely is lost as well.
    assert led.final([(b"a" * 32, digest(b"one"))]).lost == 1
    # An unacknowledged write that is missing is not a loss.
    assert led.final([(b"a" * 32, digest(b"one")), (b"b" * 32, digest(b"two"))]).lost == 0


def test_different_bytes_for_a_key_are_corrupt_acknowledged_or_not():
    led = _ledger((b"a" * 32, b"one", True), (b"c" * 32, b"three", False))
    assert led.served(b"a" * 32, digest(b"one"))
    assert not led.served(b"a" * 32, digest(b"onf"))
    assert not led.served(b"z" * 32, digest(b"never written"))
    v = led.final([(b"a" * 32, digest(b"one")), (b"c" * 32, digest(b"thrfe"))])
    assert (v.lost, v.corrupt) == (0, 3)
    v = _ledger((b"c" * 32, b"three", False)).final([(b"c" * 32, digest(b"three"))])
    assert (v.corrupt, v.unacknowledged_found) == (0, 1)


def test_a_key_is_never_written_with_two_payloads():
    led = _ledger((b"a" * 32, b"one", False))
    with pytest.raises(ValueError):
        led.attempt(b"a" * 32, digest(b"two"))
    with pytest.raises(KeyError):
        led.acknowledge(b"q" * 32)


@pytest.mark.parametrize("duration", [MIN_DURATION_S, 120, 1200, 3600])
def test_every_fault_kind_fits_in_any_run_and_faults_do_not_overlap(duration):
    faults = plan(duration, seed=7)
    assert {f.kind for f in faults} == set(FAULT_KINDS)
    assert plan(duration, seed=7) == faults, "seeded"
    ends = [0.0] + [f.start_s + f.length_s for f in faults]
    for f, prev_end in zip(faults, ends):
        assert f.start_s >= prev_end + 4.0 - 1e-6, "a baseline of 4 s or more before each fault"
        assert f.length_s >= 8.0
    assert ends[-1] <= duration - 5.0
    if duration >= 1200:
        assert len(faults) >= 25, "a long run repeats every kind"
    with pytest.raises(ValueError):
        plan(MIN_DURATION_S - 1, seed=7)


def test_the_proxy_black_holes_then_resumes():
    echo = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = echo.accept()
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    proxy = BlackHoleProxy(echo.getsockname())
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as c:
            c.sendall(b"ping")
            assert c.recv(16) == b"ping"
            proxy.partition()
            c.sendall(b"lost?")
            c.settimeout(1.0)
            with pytest.raises(socket.timeout):
                c.recv(16)
            proxy.heal()
            c.settimeout(5)
            assert c.recv(16) == b"lost?", "the held bytes are delivered once healed"
    finally:
        proxy.close()
        echo.close()


def test_a_two_minute_soak_passes_with_every_fault(tmp_path, kvtier_bin):
    """The real run, as the tracker names it (``--out`` a fresh directory), on
    the binary the whole suite tests (``$KVTIER_BIN``, else the debug build
    ``make test`` made): a release build would add minutes of compiling to
    the suite, and the checks here (nothing lost or corrupt, RSS and
    descriptors bounded, every fault run) do not depend on speed. The
    full-length run of notes/045 uses the release binary."""
    out = tmp_path / "soak"
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "soak.py"), "--duration", "120", "--seed", "1",
         "--out", str(out)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "KVTIER_BIN": str(kvtier_bin)},
    )
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-6000:]
    rec = json.loads((out / "soak.json").read_text())
    for key in ("acknowledged", "lost", "corrupt", "max_rss_mib", "rss_bound_mib", "fds_start", "fds_end",
                "windows", "faults", "hung", "date", "commit", "machine", "command", "versions"):
        assert key in rec, key
    assert rec["passed"] and rec["failures"] == []
    assert rec["lost"] == 0 and rec["corrupt"] == 0 and rec["hung"] == 0
    assert rec["acknowledged"] > 500, "the load wrote something"
    assert 0 < rec["max_rss_mib"] <= rec["rss_bound_mib"]
    assert {f["kind"] for f in rec["faults"]} == set(FAULT_KINDS)
    kinds = {w["kind"] for w in rec["windows"]}
    assert kinds == {*FAULT_KINDS, "baseline"}
    for w in rec["windows"]:
        assert {"error_rate", "p99_ms", "ops"} <= set(w), w
    stalls = [s for f in rec["faults"] for s in f.get("stalls", [])]
    assert stalls and all(s["closed_after_s"] is not None for s in stalls)
    assert wall < 240, f"the 2-minute soak took {wall:.0f} s"
