#!/usr/bin/env python3
"""A network lab on one machine: client and server in two network namespaces
joined by a user-space delay line, so TCP endpoints see a real round-trip time,
a real rate limit and real window dynamics (this kernel has no netem; an
application-level proxy would terminate TCP and hide them).

    client ns                      this process (root ns)                   server ns
    10.77.0.1  [tun] <--fd--> delay line: rate queue + one-way delay <--fd--> [tun] 10.77.0.2

Each TUN device is created here, its file descriptor kept, and the device moved
into its namespace. The delay line (`delayline`, a child process) reads IP
packets from one descriptor and writes them to the other after

    departure = max(arrival, previous departure) + size / rate   (rate queue, drop-tail)
    release   = departure + one-way delay                         (propagation)

so a packet waits behind the ones before it when the link is rate-limited and
then travels for RTT / 2. The rate queue holds at most QUEUE_BYTES (1,000
full-size packets, netem's default limit); packets beyond it are dropped.
Propagation is unbounded, like a wire.

Measured, not assumed: every setting is validated before it is used: the RTT
(median TCP connect time, client ns -> server ns) must be within 10 % of the
configured value (at 0: at most 1 ms, the lab's own path on a loaded machine), and with --rate the throughput of 16
streams must stay at or below the rate (+2 %).

usage: scripts/netlab.sh --rtt 0,10,30,150,550 --streams 1,4,16 [--rate 16mbit]
       [--duration 10s] --out DIR
writes DIR/record.json (one entry per (rtt, streams)) and DIR/summary.md
(seed 003's numbers side by side). Needs root; creates and removes its own
namespaces and stops every process it started.
"""
from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _perf  # noqa: F401 (puts perf on sys.path)

from perf import HEADER_KEYS, header, write_record

TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
MTU = 1500
QUEUE_BYTES = 1000 * MTU
CLIENT_IP, SERVER_IP = "10.77.0.1", "10.77.0.2"
PROBE_PORT = 5201
# Seed 003 (iperf3, VirtualBox host-only network, 30 s, one stream):
# RTT ms -> (client>server, server>client) Mbit/s.
SEED_003 = {0: (2460, 2320), 10: (370, 239), 30: (323, 85), 150: (137, 32), 550: (34.5, 10.7)}


def parse_rate(s: str | None) -> float | None:
    """'16mbit' -> bits/s; None or '' -> unlimited."""
    if not s:
        return None
    s = s.strip().lower()
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if s.endswith(unit):
            return float(s[: -len(unit)]) * mult
    raise SystemExit(f"--rate {s!r}: expected e.g. 16mbit, 1gbit")


def parse_seconds(s: str) -> float:
    s = s.strip()
    if s.endswith("ms"):
        return float(s[:-2]) / 1000
    return float(s[:-1]) if s.endswith("s") else float(s)


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


# ---------------------------------------------------------------- delay line

def delayline(fd_a: int, fd_b: int, one_way_s: float, rate_bps: float | None, stop_fd: int) -> None:
    """Forwards packets a<->b with a rate queue and a one-way delay until stop_fd is readable."""
    for fd in (fd_a, fd_b):
        os.set_blocking(fd, False)
    # select() takes its timeout in microseconds (epoll's is rounded up to
    # milliseconds), so a release is neither late by a millisecond nor does
    # waiting for it stop the other direction's packets from being read. The
    # RTT this produces is measured and validated, not assumed.
    # Waking from a sleep still takes time (a VM's idle vCPU most of all), so
    # the loop learns its own wake-up lateness (an EWMA of how late past
    # its target it woke, capped at 1 ms) and aims that much early.
    early = 0.0
    dirs: dict[int, list[Any]] = {fd_a: [fd_b, collections.deque(), 0.0], fd_b: [fd_a, collections.deque(), 0.0]}
    stats = {"forwarded": 0, "dropped": 0}
    watched = [fd_a, fd_b, stop_fd]
    while True:
        now = time.monotonic()
        nxt = min((d[1][0][0] for d in dirs.values() if d[1]), default=None)
        timeout = 1.0 if nxt is None else max(0.0, nxt - now - early)
        target = now + timeout
        readable, _, _ = select.select(watched, [], [], timeout)
        if nxt is not None and not readable:
            late = time.monotonic() - target
            early = min(0.001, max(0.0, 0.9 * early + 0.1 * late))
        for fd in readable:
            if fd == stop_fd:
                print(json.dumps(stats), file=sys.stderr, flush=True)
                return
            out, q, last_dep = dirs[fd]
            while True:
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                t = time.monotonic()
                if rate_bps:
                    start = max(t, last_dep)
                    if (start - t) * rate_bps / 8 > QUEUE_BYTES:
                        stats["dropped"] += 1
                        continue
                    last_dep = start + len(pkt) * 8 / rate_bps
                    dep = last_dep
                else:
                    dep = t
                q.append((dep + one_way_s, pkt))
            dirs[fd][2] = last_dep
        now = time.monotonic() + early
        for out, q, _ in dirs.values():
            while q and q[0][0] <= now:
                try:
                    os.write(out, q.popleft()[1])
                    stats["forwarded"] += 1
                except BlockingIOError:
                    break


# ---------------------------------------------------------------- TCP probe

def sink(port: int, streams: int) -> None:
    """Accepts `streams` connections, counts what arrives, prints JSON at the end."""
    ls = socket.create_server(("0.0.0.0", port), backlog=64, reuse_port=False)
    print("ready", flush=True)
    conns = [ls.accept()[0] for _ in range(streams)]
    for c in conns:
        c.setblocking(False)
    ep = select.epoll()
    for c in conns:
        ep.register(c.fileno(), select.EPOLLIN)
    by_fd = {c.fileno(): c for c in conns}
    total, open_ = 0, len(conns)
    first: float | None = None
    last = 0.0
    buf = bytearray(1 << 20)
    while open_:
        for fd, _ in ep.poll(5.0):
            c = by_fd[fd]
            while True:
                try:
                    n = c.recv_into(buf)
                except BlockingIOError:
                    break
                if n == 0:
                    ep.unregister(fd)
                    open_ -= 1
                    break
                now = time.monotonic()
                first = first if first is not None else now
                last = now
                total += n
    print(json.dumps({"bytes": total, "seconds": (last - first) if first else 0.0}), flush=True)


def source(host: str, port: int, streams: int, seconds: float) -> None:
    """Opens `streams` connections and sends on all of them for `seconds`."""
    conns = [socket.create_connection((host, port), timeout=30) for _ in range(streams)]
    chunk = b"\0" * (256 << 10)
    for c in conns:
        c.setblocking(False)
    end = time.monotonic() + seconds
    ep = select.epoll()
    for c in conns:
        ep.register(c.fileno(), select.EPOLLOUT)
    by_fd = {c.fileno(): c for c in conns}
    while time.monotonic() < end:
        for fd, _ in ep.poll(max(0.0, end - time.monotonic())):
            try:
                by_fd[fd].send(chunk)
            except BlockingIOError:
                pass
    for c in conns:
        c.setblocking(True)
        c.shutdown(socket.SHUT_WR)
        c.close()


def connect_rtt(host: str, port: int, n: int) -> None:
    """Median of n TCP connect times (SYN -> SYN/ACK: one round trip), ms, printed."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        s = socket.create_connection((host, port), timeout=30)
        out.append((time.perf_counter() - t) * 1000)
        s.close()
    print(json.dumps({"rtt_ms": statistics.median(out), "samples": out}), flush=True)


def echo_server(port: int) -> None:
    ls = socket.create_server(("0.0.0.0", port), backlog=128)
    print("ready", flush=True)
    while True:
        ls.accept()[0].close()


# ---------------------------------------------------------------- the lab

class Lab:
    def __init__(self, tag: str):
        self.client_ns, self.server_ns = f"kvtlab-c-{tag}", f"kvtlab-s-{tag}"
        self.tun_c, self.tun_s = f"kvtc{tag}"[:15], f"kvts{tag}"[:15]
        self.procs: list[subprocess.Popen] = []
        self.line: subprocess.Popen | None = None
        self.stop_w: int | None = None

    def __enter__(self):
        for ns in (self.client_ns, self.server_ns):
            sh("ip", "netns", "add", ns)
        self.fd_c, self.fd_s = open_tun(self.tun_c), open_tun(self.tun_s)
        for tun, ns, me, peer in ((self.tun_c, self.client_ns, CLIENT_IP, SERVER_IP),
                                  (self.tun_s, self.server_ns, SERVER_IP, CLIENT_IP)):
            sh("ip", "link", "set", "dev", tun, "netns", ns)
            ex = ("ip", "netns", "exec", ns)
            sh(*ex, "ip", "link", "set", "lo", "up")
            sh(*ex, "ip", "addr", "add", me, "peer", peer, "dev", tun)
            sh(*ex, "ip", "link", "set", tun, "mtu", str(MTU), "up")
        return self

    def set_link(self, rtt_ms: float, rate_bps: float | None, base_ms: float = 0.0) -> None:
        """(Re)starts the delay line for an RTT of `rtt_ms`, of which the lab's
        own path (namespaces, TUN, the delay line's forwarding) is `base_ms`."""
        rtt_ms = max(0.0, rtt_ms - base_ms) if rtt_ms > 0 else 0.0
        self.stop_line()
        r, w = os.pipe()
        self.stop_w = w
        args = [sys.executable, __file__, "delayline", "--fd-a", str(self.fd_c), "--fd-b", str(self.fd_s),
                "--one-way-ms", str(rtt_ms / 2), "--stop-fd", str(r)]
        if rate_bps:
            args += ["--rate-bps", str(rate_bps)]
        self.line = subprocess.Popen(args, pass_fds=(self.fd_c, self.fd_s, r))
        os.close(r)

    def stop_line(self) -> None:
        if self.line is not None:
            assert self.stop_w is not None, "start_line sets both"
            os.close(self.stop_w)
            try:
                self.line.wait(10)
            except subprocess.TimeoutExpired:
                self.line.kill()
                self.line.wait()
            self.line = None

    def run_in(self, ns: str, *args: str, **kw) -> subprocess.Popen:
        p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__, *args],
                             stdout=subprocess.PIPE, text=True, **kw)
        self.procs.append(p)
        return p

    def wait_ready(self, p: subprocess.Popen) -> None:
        assert p.stdout is not None, "run_in pipes stdout"
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"lab process did not start: {line!r}")

    def rtt(self, n: int = 10) -> float:
        srv = self.run_in(self.server_ns, "_echo", "--port", str(PROBE_PORT + 1))
        try:
            self.wait_ready(srv)
            c = self.run_in(self.client_ns, "_rtt", "--host", SERVER_IP, "--port", str(PROBE_PORT + 1), "--n", str(n))
            out, _ = c.communicate(timeout=120 + n * 2)
            return json.loads(out)["rtt_ms"]
        finally:
            srv.kill()
            srv.wait()

    def throughput(self, streams: int, seconds: float) -> dict:
        s = self.run_in(self.server_ns, "_sink", "--port", str(PROBE_PORT), "--streams", str(streams))
        self.wait_ready(s)
        c = self.run_in(self.client_ns, "_source", "--host", SERVER_IP, "--port", str(PROBE_PORT),
                        "--streams", str(streams), "--seconds", str(seconds))
        c.wait(timeout=seconds + 120)
        out, _ = s.communicate(timeout=seconds + 120)
        r = json.loads(out)
        r["gbit_s"] = r["bytes"] * 8 / r["seconds"] / 1e9 if r["seconds"] > 0 else 0.0
        return r

    def __exit__(self, *exc):
        self.stop_line()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for fd in (getattr(self, "fd_c", None), getattr(self, "fd_s", None)):
            if fd is not None:
                os.close(fd)
        for ns in (self.client_ns, self.server_ns):
            sh("ip", "netns", "del", ns, check=False)


def validate_rtt(configured: float, measured: float) -> bool:
    # At 0 there is no 10 %: the lab's own round trip (0.2-0.5 ms idle) is what is measured.
    return abs(measured - configured) <= (1.0 if configured == 0 else 0.10 * configured)


def summary(record: dict) -> str:
    rate = record["rate_mbit"]
    lines = [
        "# Network lab: TCP throughput vs RTT and streams",
        "",
        f"{record['date']}, commit `{(record.get('commit') or record.get('git_commit') or '?')[:10]}`, "
        f"{record['machine']['hostname']}; "
        f"link: {f'{rate:g} Mbit/s' if rate else 'no rate limit (the delay line is the only limit)'}; "
        f"{record['duration_s']:g} s per entry; client -> server (the sink measures).",
        "",
        "| RTT configured ms | RTT measured ms | RTT within 10 % | streams | Gbit/s | Mbit/s | seed 003 (1 stream, c>s / s>c) Mbit/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in record["entries"]:
        seed = SEED_003.get(int(e["rtt_ms_configured"])) if e["streams"] == 1 else None
        seed_s = f"{seed[0]:g} / {seed[1]:g}" if seed else "–"
        lines.append(
            f"| {e['rtt_ms_configured']:g} | {e['rtt_ms_measured']:.2f} | {'yes' if e['rtt_ok'] else '**no**'} | "
            f"{e['streams']} | {e['gbit_s']:.3f} | {e['gbit_s'] * 1000:.1f} | {seed_s} |")
    v = record["validation"]
    check = f"Validation: RTT within 10 % at every setting: **{'yes' if v['rtt_all_ok'] else 'no'}**"
    if rate:
        check += f"; rate limit held (16 streams ≤ rate + 2 % at every RTT): **{'yes' if v['rate_held'] else 'no'}**"
    lines += ["", check + f" (the lab's own round trip, {record['base_rtt_ms']:.2f} ms, is subtracted from each configured RTT)."]
    lines += ["", "Seed 003 ran iperf3 between two VirtualBox VMs (host-only network, 2.46 Gbit/s at ~0 ms) "
              "for 30 s per point; its numbers are the shape to compare, not the scale: this lab's "
              "link is a user-space delay line whose own packet rate caps the unthrottled case."]
    return "\n".join(lines) + "\n"


def note_record(out: Path, dirs: list[Path]) -> None:
    """One perf record for a note from several lab runs (each DIR/record.json),
    with each run's command, validation and entries as the lab wrote them."""
    runs = {d.name: json.loads((d / "record.json").read_text()) for d in dirs}
    first = next(iter(runs.values()))
    head = {k: first.get(k) for k in HEADER_KEYS}
    head["date"] = max(r["date"] for r in runs.values())
    head["command"] = " && ".join(r["command"] for r in runs.values())
    dirty = [r.get("dirty") for r in runs.values()]
    head["dirty"] = True if any(dirty) else (False if all(d is False for d in dirty) else None)
    write_record(out, {
        "method": first["method"],
        "results": {name: {k: r.get(k) for k in ("command", "date", "commit", "rate_mbit", "duration_s",
                                                   "base_rtt_ms", "validation", "entries")}
                    for name, r in runs.items()},
        "seed_003_mbit_s": first["seed_003_mbit_s"],
    }, head)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    nr = sub.add_parser("note-record", help="merge lab runs into one perf record: OUT.json DIR...")
    nr.add_argument("out", type=Path)
    nr.add_argument("dirs", type=Path, nargs="+")
    d = sub.add_parser("delayline")
    d.add_argument("--fd-a", type=int, required=True)
    d.add_argument("--fd-b", type=int, required=True)
    d.add_argument("--one-way-ms", type=float, required=True)
    d.add_argument("--rate-bps", type=float)
    d.add_argument("--stop-fd", type=int, required=True)
    s = sub.add_parser("_sink")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--streams", type=int, required=True)
    so = sub.add_parser("_source")
    for f in ("--host",):
        so.add_argument(f, required=True)
    so.add_argument("--port", type=int, required=True)
    so.add_argument("--streams", type=int, required=True)
    so.add_argument("--seconds", type=float, required=True)
    r = sub.add_parser("_rtt")
    r.add_argument("--host", required=True)
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--n", type=int, default=10)
    e = sub.add_parser("_echo")
    e.add_argument("--port", type=int, required=True)
    ap.add_argument("--rtt", default="0,10,30,150,550")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--rate", default="")
    ap.add_argument("--duration", default="10s")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.cmd == "note-record":
        return note_record(a.out, a.dirs)
    if a.cmd == "delayline":
        return delayline(a.fd_a, a.fd_b, a.one_way_ms / 1000, a.rate_bps, a.stop_fd)
    if a.cmd == "_sink":
        return sink(a.port, a.streams)
    if a.cmd == "_source":
        return source(a.host, a.port, a.streams, a.seconds)
    if a.cmd == "_rtt":
        return connect_rtt(a.host, a.port, a.n)
    if a.cmd == "_echo":
        return echo_server(a.port)
    if not a.out:
        ap.error("--out DIR is required")
    if os.geteuid() != 0:
        raise SystemExit("netlab needs root (network namespaces and TUN devices)")
    rtts = [float(x) for x in a.rtt.split(",") if x.strip()]
    streams = [int(x) for x in a.streams.split(",") if x.strip()]
    rate = parse_rate(a.rate)
    seconds = parse_seconds(a.duration)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    head = header()
    entries = []
    # Ctrl-C and SIGTERM still tear the lab down (the with-block's __exit__).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with Lab(str(os.getpid() % 100000)) as lab:
        # The lab's own round trip, with no delay added: subtracted from every
        # configured RTT so that the measured one matches it.
        lab.set_link(0, None)
        base = lab.rtt(20)
        print(f"lab base RTT (no delay): {base:.3f} ms", flush=True)
        for rtt in rtts:
            lab.set_link(rtt, rate, base)
            measured = lab.rtt()
            ok = validate_rtt(rtt, measured)
            print(f"rtt {rtt:g} ms: measured {measured:.2f} ms ({'ok' if ok else 'OFF BY MORE THAN 10 %'})", flush=True)
            for n in streams:
                t = lab.throughput(n, seconds)
                entries.append({"rtt_ms_configured": rtt, "rtt_ms_measured": measured, "rtt_ok": ok,
                                "streams": n, "gbit_s": t["gbit_s"], "bytes": t["bytes"], "seconds": t["seconds"],
                                "rate_mbit": rate / 1e6 if rate else None})
                print(f"  {n:>2} streams: {t['gbit_s'] * 1000:.1f} Mbit/s", flush=True)
            if rate:
                t16 = lab.throughput(16, min(seconds, 5.0)) if 16 not in streams else None
                if t16:
                    entries.append({"rtt_ms_configured": rtt, "rtt_ms_measured": measured, "rtt_ok": ok,
                                    "streams": 16, "gbit_s": t16["gbit_s"], "bytes": t16["bytes"],
                                    "seconds": t16["seconds"], "rate_mbit": rate / 1e6, "validation_only": True})
    rate_held = None
    if rate:
        rate_held = all(e["gbit_s"] * 1e9 <= rate * 1.02 for e in entries if e["streams"] == 16)
    record = write_record(out / "record.json", {
        "method": "two network namespaces joined by a user-space TUN delay line (scripts/netlab.py); "
                  "RTT = median TCP connect time; throughput = bytes received by the sink / its receive window",
        "mtu": MTU, "queue_bytes": QUEUE_BYTES, "duration_s": seconds, "base_rtt_ms": base,
        "rate_mbit": rate / 1e6 if rate else None,
        "entries": entries,
        "validation": {"rtt_all_ok": all(e["rtt_ok"] for e in entries), "rate_held": rate_held},
        "seed_003_mbit_s": {str(k): v for k, v in SEED_003.items()},
    }, head)
    (out / "summary.md").write_text(summary(record))
    print(f"wrote {out / 'summary.md'}")


if __name__ == "__main__":
    main()
