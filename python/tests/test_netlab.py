"""The network lab (scripts/netlab.sh, notes/015): two namespaces joined by a
user-space delay line. The lab is validated by its own measurements: a
configured RTT shows up as a measured TCP round trip (within 10 %), a rate
limit holds, throughput falls with RTT for one stream, and the lab leaves no
namespace behind. Needs root (CI runs as root)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _netlab(out: Path, *args: str) -> dict:
    # make test runs as root (README): without root or iproute2 this fails, never skips.
    if os.geteuid() != 0:
        pytest.fail("the network lab needs root (network namespaces, TUN devices)")
    if shutil.which("ip") is None:
        pytest.fail("the network lab needs iproute2's `ip` (scripts/setup.sh installs it)")
    r = subprocess.run([str(ROOT / "scripts/netlab.sh"), *args, "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "summary.md").is_file()
    return json.loads((out / "record.json").read_text())


def _namespaces() -> set[str]:
    return {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                       text=True).stdout.splitlines() if line.strip()}


def test_configured_rtt_is_measured_and_one_stream_slows_with_it(tmp_path):
    before = _namespaces()
    rec = _netlab(tmp_path, "--rtt", "0,40", "--streams", "1", "--duration", "2s")
    assert _namespaces() == before, "the lab left namespaces behind"
    by_rtt = {e["rtt_ms_configured"]: e for e in rec["entries"]}
    assert set(by_rtt) == {0.0, 40.0}
    assert 36.0 <= by_rtt[40.0]["rtt_ms_measured"] <= 44.0, by_rtt[40.0]
    assert by_rtt[0.0]["rtt_ms_measured"] < 2.0
    assert all(e["rtt_ok"] for e in rec["entries"])
    assert by_rtt[0.0]["gbit_s"] > 0 and by_rtt[40.0]["gbit_s"] > 0


def test_a_rate_limit_holds(tmp_path):
    rec = _netlab(tmp_path, "--rtt", "20", "--streams", "4", "--rate", "16mbit", "--duration", "3s")
    assert rec["rate_mbit"] == 16
    for e in rec["entries"]:
        mbit = e["gbit_s"] * 1000
        # At most the rate (+2 %: the sink's window starts at the first byte),
        # and the link is used: 4 streams over 20 ms fill 16 Mbit/s.
        assert mbit <= 16 * 1.02, e
        assert mbit >= 16 * 0.7, e
    assert rec["validation"]["rate_held"] is True


def test_striping_beats_one_stream_where_the_window_is_the_limit(tmp_path, kvtier_bin):
    """notes/020: at a non-zero RTT whose bandwidth-delay product exceeds one
    connection's window (the client namespace's receive buffer capped at
    512 KiB: 30 ms x 200 Mbit/s is 750 KB), a long prefix read striped over 8
    connections gets more of the link than one connection, and the lab's RTT
    is what was configured. A 256-block prefix of 128 KiB blocks (32 MiB)."""
    if os.geteuid() != 0:
        pytest.fail("the network lab needs root (network namespaces, TUN devices)")
    out = tmp_path / "prefix"
    r = subprocess.run(["python3", str(ROOT / "scripts/netlab-prefix.py"), "--rtt", "30", "--stripes", "1,8",
                        "--rate", "200mbit", "--client-rmem", str(512 << 10), "--value-size", str(128 << 10),
                        "--duration", "2s", "--warmup", "0s", "--repeat", "1", "--kvtier", str(kvtier_bin),
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rec = json.loads((out / "record.json").read_text())
    by = {e["stripes"]: e for e in rec["entries"]}
    assert 27.0 <= by[1]["rtt_ms_measured"] <= 33.0, by[1]
    assert all(e["errors"] == 0 and e["ops"] >= 1 for e in rec["entries"]), rec["entries"]
    one, striped = by[1]["goodput_mbit_s"], by[8]["goodput_mbit_s"]
    # The window caps one connection near 512 KiB / 30 ms (~70-140 Mbit/s);
    # eight of them are capped by the 200 Mbit/s link.
    assert striped >= 1.3 * one, (one, striped)
