#!/usr/bin/env python3
"""Server memory under the stalled-upload attacks docs/operations.md lists
("Memory"), with the
request limits off ("before": server.request_memory = 1 TiB, read_timeout =
1 h, as the server behaved before they existed) and at their defaults
("after"), same binary, same run. Writes notes/011-overload-memory.json.

Attacks (each against a fresh server, --memory-capacity 512MiB):
  wire: N data-plane connections each announce a Write of S MiB, send all
        but 1 MiB of it, and stall;
  http: N HTTP PUTs each announce S MiB (Content-Length), send all but
        1 MiB, and stall.
Measured: the server's VmRSS (/proc/PID/status) before the attack, and its
peak while the attack holds (sampled every 50 ms for --hold seconds after
the last byte was sent), plus how many uploads were refused at once
(data plane: an error frame; HTTP: 503) and how many the server cut
(closed before --hold ended).

usage: .venv/bin/python scripts/overload-memory.py [--conns 16] [--wire-mib 120]
       [--http-mib 60] [--hold 3] [--out notes/011-overload-memory.json]
"""
from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from pathlib import Path

from _perf import ROOT

from kvtier._proto import load
from kvtier.dataplane import parse_addr
from perf import Sampler, header, versions, write_record
from perf.services import kvtier_server, release_binary

MIB = 1 << 20
# The data plane's frame header (docs/wire.md): magic, kind, flags, reserved, id, meta_len, data_len.
HEADER = struct.Struct("<4sBBHQII")
MAGIC, WRITE = b"KVW1", 2
BEFORE = '[server]\nrequest_memory = "1TiB"\nread_timeout = "1h"\nidle_timeout = "1h"\n'


def wire_upload(addr, mib: int, i: int, pb) -> socket.socket:
    size = mib * MIB
    meta = pb.wire.WireWriteRequest(
        request=pb.v1.WriteRequest(namespace="attack", blocks=[pb.v1.Block(key=b"k%08d" % i)]),
        payload_lengths=[size],
    ).SerializeToString()
    s = socket.create_connection(addr)
    s.sendall(HEADER.pack(MAGIC, WRITE, 0, 0, i + 1, len(meta), size) + meta)
    return s


def http_upload(addr, mib: int, i: int, pb) -> socket.socket:
    s = socket.create_connection(addr)
    s.sendall(f"PUT /v1/kv/attack/k{i} HTTP/1.1\r\nHost: x\r\nContent-Length: {mib * MIB}\r\n\r\n".encode())
    return s


def refused(s: socket.socket) -> str | None:
    """'refused' if the server already answered (error frame / 503), 'closed'
    if it closed, None while it waits for the rest."""
    s.setblocking(False)
    try:
        b = s.recv(64)
    except BlockingIOError:
        return None
    except OSError:
        return "closed"
    finally:
        s.setblocking(True)
    if not b:
        return "closed"
    return "refused"


def attack(kind: str, conns: int, mib: int, hold: float, limits_on: bool, binary: Path) -> dict:
    server = kvtier_server(binary, ["--memory-capacity", "512MiB", "--max-block-size", "256MiB",
                                    "--max-message-size", "512MiB"], config="" if limits_on else BEFORE)
    pb = load()
    try:
        time.sleep(0.2)
        target = server.ready["data"] if kind == "wire" else server.http
        assert target, f"the server has no {kind} listener"
        addr = parse_addr(str(target))
        with Sampler(server.pid, 0.05) as rss:
            socks = []
            chunk = b"\0" * MIB
            start = time.monotonic()
            for i in range(conns):
                s = (wire_upload if kind == "wire" else http_upload)(addr, mib, i, pb)
                s.settimeout(30)
                sent = 0
                try:
                    while sent < (mib - 1) * MIB:
                        s.sendall(chunk)
                        sent += MIB
                except OSError:
                    pass  # refused: the server closed while we sent
                socks.append(s)
            time.sleep(hold)
            outcomes = [refused(s) for s in socks]
        elapsed = time.monotonic() - start
        for s in socks:
            s.close()
        return {
            "attack": kind,
            "limits": "defaults" if limits_on else "off",
            "connections": conns,
            "announced_mib_each": mib,
            "rss_before_mib": rss.result()["rss_before_mib"],
            "rss_peak_mib": rss.result()["rss_peak_mib"],
            "rss_growth_mib": round(rss.rss_peak - rss.rss_before, 1),
            "refused_or_closed": sum(o is not None for o in outcomes),
            "still_waiting": sum(o is None for o in outcomes),
            "seconds": round(elapsed, 2),
        }
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--wire-mib", type=int, default=120)
    ap.add_argument("--http-mib", type=int, default=60)
    ap.add_argument("--hold", type=float, default=3.0)
    ap.add_argument("--binary", default=str(release_binary()))
    ap.add_argument("--out", default=str(ROOT / "notes/011-overload-memory.json"))
    a = ap.parse_args()
    binary = Path(a.binary)
    if not binary.is_file():
        sys.exit(f"{binary} not found: cargo build --release -p kvtier (or --binary)")
    head = header(versions=versions("kvtier", paths={"kvtier": binary}))
    results = []
    for kind, mib in (("wire", a.wire_mib), ("http", a.http_mib)):
        for limits_on in (False, True):
            r = attack(kind, a.conns, mib, a.hold, limits_on, binary)
            print(json.dumps(r), flush=True)
            results.append(r)
    write_record(a.out, {
        "title": "Server memory under stalled uploads, request limits off vs on",
        "binary": str(binary.relative_to(ROOT)) if binary.is_relative_to(ROOT) else str(binary),
        "settings": {"memory_capacity_mib": 512, "request_memory": "default (a quarter of the memory tier: 128 MiB)",
                     "before": BEFORE.strip().splitlines()[1:], "hold_seconds": a.hold},
        "results": results,
    }, head)


if __name__ == "__main__":
    main()
