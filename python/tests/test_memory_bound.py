"""The server's resident memory, measured (``VmRSS`` of the real process),
stays within the documented bound under the attacks and floods that
docs/operations.md ("Memory") lists and notes/011, 014 and 024 measured:
memory tier x 1.1 + ``server.request_memory`` + 64 MiB (docs/operations.md).

- Stalled uploads: data-plane Writes and HTTP PUTs that announce large
  bodies, send all but 1 MiB and stall. The same attack against a server with
  the request limits switched off (the control) must break the bound, which
  shows the measurement can fail.
- A write flood of 1.2 MB blocks from ``kvtier bench`` at concurrency 32,
  over gRPC and over the data plane.

RSS is sampled every 20 ms while the load runs; the peak is compared.
scripts/overload-memory.py and scripts/flood-memory.py record the same
figures at full size in notes/011 and notes/024."""
from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kvtier._proto import load
from kvtier.dataplane import parse_addr
from kvtier.server import Server

from frames import HEADER, MAGIC, Kind

MIB = 1 << 20
TIER_MIB = 128
REQUEST_MIB = 64  # server.request_memory's default for this tier: max(tier / 4, 64 MiB)
BOUND_MIB = TIER_MIB * 1.1 + REQUEST_MIB + 64
LIMITS_OFF = '[server]\nrequest_memory = "1TiB"\nread_timeout = "1h"\nidle_timeout = "1h"\n'


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class PeakRss:
    """Samples a process's RSS every 20 ms until stopped; ``peak`` in MiB."""

    def __init__(self, pid: int):
        self.pid, self.peak = pid, rss_mib(pid)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
            except OSError:
                return

    def stop(self) -> float:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_mib(self.pid))
        return self.peak


def start(kvtier_bin: Path, tmp_path: Path, limits_on: bool = True) -> Server:
    cfg = tmp_path / ("limits.toml" if limits_on else "limits-off.toml")
    cfg.write_text("" if limits_on else LIMITS_OFF)
    return Server.start(kvtier_bin, ["--config", str(cfg), "--memory-capacity", f"{TIER_MIB}MiB",
                                     "--max-block-size", "256MiB", "--max-message-size", "512MiB"])


def wire_upload(addr, size: int, i: int, pb) -> socket.socket:
    meta = pb.wire.WireWriteRequest(
        request=pb.v1.WriteRequest(namespace="attack", blocks=[pb.v1.Block(key=b"w%08d" % i)]),
        payload_lengths=[size],
    ).SerializeToString()
    s = socket.create_connection(addr, timeout=10)
    s.sendall(HEADER.pack(MAGIC, Kind.WRITE, 0, 0, i + 1, len(meta), size) + meta)
    return s


def http_upload(addr, size: int, i: int, _pb) -> socket.socket:
    s = socket.create_connection(addr, timeout=10)
    s.sendall(f"PUT /v1/kv/attack/h{i} HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
    return s


def stall_uploads(server: Server, conns: int, mib: int) -> float:
    """``conns`` data-plane Writes and as many HTTP PUTs of ``mib`` MiB each,
    all but 1 MiB sent, held open; returns the server's peak RSS (MiB)."""
    pb = load()
    sampler = PeakRss(server.pid)
    socks = []
    chunk = b"\0" * MIB
    try:
        for kind, addr in ((wire_upload, parse_addr(server.ready["data"])), (http_upload, parse_addr(server.http))):
            for i in range(conns):
                s = kind(addr, mib * MIB, i, pb)
                socks.append(s)
                try:
                    for _ in range(mib - 1):
                        s.sendall(chunk)
                except OSError:
                    pass  # refused or cut: the server closed (or stopped reading) while we sent
        # Hold the stalled uploads a moment with everything they got in.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return sampler.stop()
    finally:
        sampler.stop()
        for s in socks:
            s.close()


def test_stalled_uploads_keep_rss_within_the_bound(kvtier_bin, tmp_path):
    server = start(kvtier_bin, tmp_path)
    try:
        peak = stall_uploads(server, conns=6, mib=48)
        assert server.proc.poll() is None, "the server died under the attack"
    finally:
        server.stop()
    assert peak <= BOUND_MIB, (
        f"RSS peaked at {peak:.0f} MiB under 12 stalled 48 MiB uploads; the bound is {BOUND_MIB:.0f} MiB")


def test_without_request_limits_stalled_uploads_break_the_bound(kvtier_bin, tmp_path):
    # The control: the same attack on a server that admits every byte.
    server = start(kvtier_bin, tmp_path, limits_on=False)
    try:
        peak = stall_uploads(server, conns=6, mib=48)
    finally:
        server.stop()
    assert peak > BOUND_MIB, f"without limits RSS peaked at only {peak:.0f} MiB (bound {BOUND_MIB:.0f})"


@pytest.mark.parametrize("transport", ["grpc", "wire"])
def test_a_write_flood_keeps_rss_within_the_bound(kvtier_bin, tmp_path, transport):
    server = start(kvtier_bin, tmp_path)
    try:
        sampler = PeakRss(server.pid)
        try:
            r = subprocess.run(
                [str(kvtier_bin), "bench", "--target", server.grpc, "--workload", "write",
                 "--transport", transport, "--value-size", "1258291", "--concurrency", "32",
                 "--duration", "3s", "--warmup", "200ms", "--quiet", "--out", str(tmp_path / "bench")],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            peak = sampler.stop()
        assert r.returncode == 0, r.stderr[-2000:]
        assert server.proc.poll() is None, "the server died under the flood"
        stored = rss_mib(server.pid)
    finally:
        server.stop()
    assert peak <= BOUND_MIB, (
        f"RSS peaked at {peak:.0f} MiB under a 32-writer {transport} flood (now {stored:.0f}); "
        f"the bound is {BOUND_MIB:.0f} MiB")
