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


def test_codec_break_even_run_reads_every_codec_back_through_a_shaped_link(tmp_path, kvtier_bin):
    """scripts/netlab-codecs.py (notes/065), small: 8 blocks of 1 MiB of
    Gaussian bf16 per codec through MinIO, the kernel link unshaped and then
    at 200 Mbit/s. The shaping holds (probe and raw read no faster than the
    rate), every block comes back (byte for byte, fp8 within its bound), the
    lossless codecs store fewer bytes than raw and fp8 about half, and the
    namespace is gone afterwards."""
    if os.geteuid() != 0:
        pytest.fail("the codec lab needs root (network namespaces, tc)")
    import random
    import struct

    rng = random.Random(1)
    values = [rng.gauss(0.0, 0.5) for _ in range(4 << 20)]  # 8 MiB of bf16
    data = tmp_path / "kv.bf16"
    data.write_bytes(b"".join(struct.pack("<f", v)[2:] for v in values))
    before = _namespaces()
    out = tmp_path / "codecs"
    r = subprocess.run(["python3", str(ROOT / "scripts/netlab-codecs.py"), "--link", "kernel",
                        "--rates", "unshaped,200mbit", "--blocks", "8", "--block-mib", "1", "--repeat", "1",
                        "--data", str(data), "--kvtier", str(kvtier_bin), "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-6000:]
    assert _namespaces() == before, "the codec lab left its namespace behind"
    rec = json.loads((out / "record.json").read_text())
    assert rec["validation"]["all_intact"] is True
    rows = {(x["rate"], x["codec"]): x for x in rec["rows"]}
    assert set(rows) == {(rate, c) for rate in ("unshaped", "200mbit")
                         for c in ("off", "lz4-planes", "zstd-planes", "fp8-e4m3")}
    shaped = rows[("200mbit", "off")]
    assert shaped["link_gbit_s"] <= 0.2 * 1.05, shaped
    # 8 MiB at 200 Mbit/s is 0.34 s; the raw read cannot beat the link.
    assert shaped["total_s"] >= 0.9 * (8 << 20) * 8 / 200e6, shaped
    assert rows[("200mbit", "off")]["ratio"] == pytest.approx(1.0, abs=0.01)
    assert rows[("200mbit", "zstd-planes")]["ratio"] > 1.1
    assert 1.9 < rows[("200mbit", "fp8-e4m3")]["ratio"] < 2.0
