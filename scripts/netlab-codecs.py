#!/usr/bin/env python3
"""When compression pays: a cold 16k-token prefix from the object store, per codec and link (notes/065).

A prefix of 128 blocks of 4 MiB (an 8B model's 16k tokens) is written once per
codec through kvtier (write-through) into MinIO, each codec under its own
namespace (`[[object_store.compression_namespaces]]`, docs/object-store.md).
Then, per link and repeat, the codecs alternate: a fresh `kvtier serve` (empty
memory, no disk: every block is cold) and the Python client do what an engine
does, one Lookup of the chain and one Read of it, timed from the Lookup to
the Read's last byte. Every block is checked: byte for byte for the lossless
codecs, length and error bound for fp8.

Two kinds of link, because this kernel has no netem (notes/015):

- `--link kernel`: MinIO, kvtier and the client in one fresh network
  namespace, on loopback; an HTB class shapes MinIO's TCP port (both
  directions) to each of `--rates` in turn, `tc class change` between them
  (`unshaped` = no class: MinIO on the same machine). Kernel speed, so 10 and
  25 Gbit/s are reachable where the CPUs allow; the RTT is loopback's.
- `--link lab`: scripts/netlab.py's TUN delay line between MinIO's namespace
  and kvtier's, at `--rtt` and one `--rates` entry: a real RTT, but the
  Python delay line tops out near 0.7 Gbit/s on this VM.

The link's rate is probed (one TCP stream, then eight, on the shaped port) in
the same run, before the reads: the floor of a raw read is the chain's bytes
at that rate plus one RTT.

Needs root and MinIO (scripts/setup.sh --test). Re-run:

  cargo build --release -p kvtier
  python3 scripts/netlab-codecs.py --link kernel --rates unshaped,25gbit,10gbit,1gbit --out notes/065-cold-tiers/kernel
  python3 scripts/netlab-codecs.py --link lab --rtt 20 --rates 500mbit --out notes/065-cold-tiers/lab-20ms
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import math
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import netlab  # scripts/netlab.py: the lab (scripts/ is on sys.path, as for _perf)
from _perf import ROOT

from perf import header, versions, write_record
from perf.services import MINIO_PASSWORD, MINIO_USER, Minio, create_bucket, kvtier_server

MINIO_PORT = 9000
BUCKET = "kvtier-codecs"
GRPC_PORT = 7731
#: namespace -> codec; `off` is the default `compression` (raw, a version-1 record).
CODECS = {"raw/": "off", "lz4/": "lz4-planes", "zstd/": "zstd-planes", "fp8/": "fp8-e4m3"}
#: fp8's bound per value in units of its chunk's scale (notes/063: 17.1 measured; 16 + bf16 rounding).
FP8_MAX_ERR_UNITS = 18.0


def config(minio_host: str) -> str:
    entries = "".join(f'[[object_store.compression_namespaces]]\nnamespace = "{ns}"\ncodec = "{c}"\n'
                      + ('dtype = "bf16"\n' if c == "fp8-e4m3" else "") for ns, c in CODECS.items() if c != "off")
    return f"""[object_store]
url = "s3://{BUCKET}/codecs"
write_policy = "write-through"
[object_store.options]
aws_endpoint = "http://{minio_host}:{MINIO_PORT}"
aws_allow_http = "true"
aws_access_key_id = "{MINIO_USER}"
aws_secret_access_key = "{MINIO_PASSWORD}"
aws_region = "us-east-1"
{entries}"""


def counters(http_addr: str) -> dict[str, float]:
    host, port = http_addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=5)
    c.request("GET", "/metrics")
    out: dict[str, float] = {}
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(("kvtier_object_put_", "kvtier_object_gets_total")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def bf16(b: bytes, n: int) -> list[float]:
    return [struct.unpack("<f", b"\0\0" + b[2 * i:2 * i + 2])[0] for i in range(n)]


def fp8_ok(want: bytes, got: bytes) -> bool:
    """fp8's promise on the first chunk of a block: each value within FP8_MAX_ERR_UNITS of amax / 448."""
    if len(got) != len(want):
        return False
    a, b = bf16(want, 1024), bf16(got, 1024)
    unit = max(abs(x) for x in a) / 448 or 1.0
    return all(math.isfinite(y) and abs(x - y) <= FP8_MAX_ERR_UNITS * unit for x, y in zip(a, b))


def tc(*args: str) -> None:
    subprocess.run(["tc", *args], check=True, capture_output=True)


def shape(rate: str | None, ports: tuple[int, ...]) -> None:
    """HTB on lo: `ports` (either direction) in class 1:10 at `rate`; everything else unshaped (default 0)."""
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    if rate is None:
        return
    bps = netlab.parse_rate(rate)
    assert bps, rate
    burst = str(max(256 << 10, int(bps / 8 * 0.002)))  # 2 ms of the rate: loopback sends 64 KiB packets
    tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "r2q", "100000")
    tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", rate, "ceil", rate,
       "burst", burst, "cburst", burst)
    for port in ports:
        for way in ("sport", "dport"):
            tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
               "match", "ip", way, str(port), "0xffff", "flowid", "1:10")


def probe(host: str, streams: int, seconds: float = 4.0) -> float:
    """Gbit/s of `streams` TCP streams to `host` on the probe port (netlab.py's sink and source)."""
    py, lab = sys.executable, str(ROOT / "scripts" / "netlab.py")
    s = subprocess.Popen([py, lab, "_sink", "--port", str(netlab.PROBE_PORT), "--streams", str(streams)],
                         stdout=subprocess.PIPE, text=True)
    assert s.stdout is not None
    assert s.stdout.readline().strip() == "ready", "probe sink did not start"
    subprocess.run([py, lab, "_source", "--host", host, "--port", str(netlab.PROBE_PORT),
                    "--streams", str(streams), "--seconds", str(seconds)], check=True, timeout=seconds + 120)
    out, _ = s.communicate(timeout=120)
    r = json.loads(out)
    return r["bytes"] * 8 / r["seconds"] / 1e9 if r["seconds"] > 0 else 0.0


def chain(ns: str, n: int) -> list[bytes]:
    return [hashlib.sha256(f"codecs-{ns}{i}".encode()).digest() for i in range(n)]


def inside(a: argparse.Namespace) -> None:
    """The measurement, in the namespace where kvtier and the client run."""
    import kvtier

    data = Path(a.data).read_bytes()
    size = a.block_mib << 20
    blocks = [data[i * size:(i + 1) * size] for i in range(a.blocks)]
    assert all(len(b) == size for b in blocks), "--data is shorter than --blocks x --block-mib"
    create_bucket(a.minio_host, MINIO_PORT, BUCKET)
    cfg = config(a.minio_host)
    log = Path(a.work) / "server.log"
    ports = (MINIO_PORT, netlab.PROBE_PORT)
    rates = a.rates.split(",")
    shape(None, ports)
    # Fill: one server, one codec after another, so the counters' deltas are each codec's bytes.
    stored: dict[str, dict[str, float]] = {}
    srv = kvtier_server(a.kvtier, ["--insecure", "--data-listen", "auto", "--memory-capacity", "3GiB"],
                        config=cfg, listen=f"127.0.0.1:{GRPC_PORT}")
    try:
        assert srv.http, "the server's HTTP listener (metrics) is off"
        c = kvtier.Client(f"127.0.0.1:{GRPC_PORT}", timeout=600)
        for ns in CODECS:
            keys, before = chain(ns, a.blocks), counters(srv.http)
            for i in range(0, a.blocks, 8):
                c.write(ns, [kvtier.Block(key=keys[j], payload=blocks[j], parent=keys[j - 1] if j else None,
                                          token_count=128) for j in range(i, i + 8)])
            after = counters(srv.http)
            stored[ns] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            print(f"filled {ns}: {json.dumps(stored[ns])}", file=sys.stderr, flush=True)
        c.close()
    finally:
        with open(log, "a") as f:
            f.write(srv.stderr_text())
        srv.stop(60)
    phases = []
    for rate in rates:
        if a.shape:
            shape(None if rate == "unshaped" else rate, ports)
        if a.probed:  # the lab's orchestrator probed its delay line (the sink must sit on MinIO's side)
            g1, g8 = (float(x) for x in a.probed.split(","))
        else:
            g1, g8 = probe(a.minio_host, 1), probe(a.minio_host, 8)
        link = {"rate": rate, "gbit_s_1_stream": g1, "gbit_s_8_streams": g8}
        print(f"link {json.dumps(link)}", file=sys.stderr, flush=True)
        runs = []
        for rep in range(a.repeat):
            order = list(CODECS) if rep % 2 == 0 else list(reversed(CODECS))  # alternate, so drift hits all
            for ns in order:
                keys = chain(ns, a.blocks)
                srv = kvtier_server(a.kvtier, ["--insecure", "--data-listen", "auto", "--memory-capacity", "3GiB"],
                                    config=cfg, listen=f"127.0.0.1:{GRPC_PORT}")
                try:
                    c = kvtier.Client(f"127.0.0.1:{GRPC_PORT}", timeout=600)
                    c.lookup(ns, keys=[b"warm-up-" + bytes(24)])  # connections up; not part of the time
                    t0 = time.monotonic()
                    found = c.lookup(ns, keys=keys).found
                    t1 = time.monotonic()
                    got = [bytes(b.payload) for b in c.read(ns, keys).blocks]
                    t2 = time.monotonic()
                    c.close()
                finally:
                    with open(log, "a") as f:
                        f.write(srv.stderr_text())
                    srv.stop(60)
                if CODECS[ns] == "fp8-e4m3":
                    intact = len(got) == a.blocks and all(fp8_ok(w, g) for w, g in zip(blocks, got))
                else:
                    intact = got == blocks
                e = {"rate": rate, "codec": CODECS[ns], "repeat": rep, "found": found, "returned": len(got),
                     "intact": intact, "lookup_s": t1 - t0, "read_s": t2 - t1, "total_s": t2 - t0}
                print(json.dumps(e), file=sys.stderr, flush=True)
                runs.append(e)
        phases.append({**link, "runs": runs})
    shape(None, ports)
    print(json.dumps({"stored": stored, "phases": phases}))


def tabulate(phases: list[dict], stored: dict, bytes_: int, rtt_ms: float) -> list[dict]:
    rows = []
    for ph in phases:
        gbit = max(ph["gbit_s_1_stream"], ph["gbit_s_8_streams"])
        floor = rtt_ms / 1000 + bytes_ * 8 / (gbit * 1e9)
        raw = statistics.median(e["total_s"] for e in ph["runs"] if e["codec"] == "off")
        for ns, codec in CODECS.items():
            es = [e for e in ph["runs"] if e["codec"] == codec]
            med = statistics.median(e["total_s"] for e in es)
            st = stored[ns]
            payload = st.get("kvtier_object_put_payload_bytes_total", 0) or bytes_
            kept = st.get("kvtier_object_put_stored_bytes_total", 0) or payload
            rows.append({"rate": ph["rate"], "link_gbit_s": gbit, "codec": codec, "ratio": payload / kept,
                         "total_s": med, "total_s_per_repeat": [e["total_s"] for e in es],
                         "lookup_s": statistics.median(e["lookup_s"] for e in es),
                         "gb_s": bytes_ / med / 1e9, "raw_floor_s": floor, "of_raw_floor": med / floor,
                         "speedup_vs_raw": raw / med, "all_intact": all(e["intact"] for e in es)})
    return rows


def summary(rec: dict) -> str:
    lines = [f"Cold 16k-token prefix ({rec['blocks']} x {rec['block_mib']} MiB) from MinIO, {rec['link']} link"
             + (f", RTT {rec['rtt_ms_measured']:.1f} ms" if rec.get("rtt_ms_measured") is not None else "")
             + f"; `{rec['command']}` at {(rec.get('commit') or '')[:10]}, {rec['date']}.", "",
             "Lookup + Read, seconds, median of alternating repeats; raw floor = the chain at the probed rate "
             "+ one RTT.", "",
             "| link | probed Gbit/s | codec | ratio | total s (repeats) | GB/s | x raw floor | speed-up vs raw |",
             "|---|---:|---|---:|---|---:|---:|---:|"]
    for r in rec["rows"]:
        reps = ", ".join(f"{t:.2f}" for t in r["total_s_per_repeat"])
        lines.append(f"| {r['rate']} | {r['link_gbit_s']:.2f} | {r['codec']} | {r['ratio']:.2f} | **{r['total_s']:.2f}** "
                     f"({reps}) | {r['gb_s']:.2f} | {r['of_raw_floor']:.2f} | **{r['speedup_vs_raw']:.2f}x** |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--link", choices=("kernel", "lab"), required=True)
    ap.add_argument("--rates", default="unshaped,25gbit,10gbit,1gbit")
    ap.add_argument("--rtt", type=float, default=20.0, help="lab only")
    ap.add_argument("--blocks", type=int, default=128)
    ap.add_argument("--block-mib", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", help="raw bf16 KV (default: codec_bench --dump's synthetic KV, notes/063)")
    ap.add_argument("--kvtier", default=str(ROOT / "target" / "release" / "kvtier"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, tc, TUN devices)")
    if a.link == "lab" and len(a.rates.split(",")) != 1:
        raise SystemExit("--link lab takes one --rates entry (the delay line's rate)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    head = header(versions=versions("kvtier", "minio", paths={"kvtier": a.kvtier}))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    py = ROOT / ".venv/bin/python"  # the Python SDK's dependencies (make test creates it)
    with tempfile.TemporaryDirectory() as tmp:
        data = a.data
        if data is None:
            data = str(Path(tmp) / "kv.bf16")
            subprocess.run(["cargo", "run", "-q", "--release", "-p", "kvtier-object", "--example", "codec_bench", "--",
                            "--blocks", str(a.blocks), "--block-mib", str(a.block_mib), "--dump", data],
                           cwd=ROOT, check=True)
        inner = [str(py if py.exists() else sys.executable), __file__, "_inside", "--kvtier",
                 str(Path(a.kvtier).resolve()), "--work", str(out.resolve()), "--data", data, "--rates", a.rates,
                 "--blocks", str(a.blocks), "--block-mib", str(a.block_mib), "--repeat", str(a.repeat)]
        rtt = None
        if a.link == "kernel":
            ns = f"kvtcodec-{os.getpid()}"
            subprocess.run(["ip", "netns", "add", ns], check=True)
            try:
                subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
                subprocess.run(["ip", "netns", "exec", ns, "ip", "addr", "add", netlab.SERVER_IP, "dev", "lo"],
                               check=True)
                (Path(tmp) / "minio").mkdir(exist_ok=True)
                minio = Minio.start(Path(tmp) / "minio", host=netlab.SERVER_IP.split("/")[0], port=MINIO_PORT,
                                    console_port=MINIO_PORT + 1, wrap=["ip", "netns", "exec", ns],
                                    log=out / "minio.log", probe=False)
                try:
                    r = subprocess.run(["ip", "netns", "exec", ns, *inner, "--minio-host",
                                        netlab.SERVER_IP.split("/")[0], "--shape"], stdout=subprocess.PIPE, text=True)
                finally:
                    minio.stop(30)
            finally:
                subprocess.run(["ip", "netns", "del", ns], check=False)
        else:
            with netlab.Lab(str(os.getpid() % 100000)) as lab:
                lab.set_link(0, None)
                base = lab.rtt(20)
                lab.set_link(a.rtt, netlab.parse_rate(a.rates), base)
                rtt = lab.rtt()
                probed = f"{lab.throughput(1, 4.0)['gbit_s']},{lab.throughput(8, 4.0)['gbit_s']}"
                (Path(tmp) / "minio").mkdir(exist_ok=True)
                minio = Minio.start(Path(tmp) / "minio", host=netlab.SERVER_IP.split("/")[0], port=MINIO_PORT,
                                    console_port=MINIO_PORT + 1, wrap=["ip", "netns", "exec", lab.server_ns],
                                    log=out / "minio.log", probe=False)
                try:
                    r = subprocess.run(["ip", "netns", "exec", lab.client_ns, *inner, "--minio-host",
                                        netlab.SERVER_IP.split("/")[0], "--probed", probed], stdout=subprocess.PIPE, text=True)
                finally:
                    minio.stop(30)
        if r.returncode != 0:
            raise SystemExit(f"the measurement failed ({r.returncode}); see {out / 'server.log'}")
    res = json.loads(r.stdout)
    bytes_ = a.blocks * (a.block_mib << 20)
    rows = tabulate(res["phases"], res["stored"], bytes_, rtt or 0.0)
    rec = write_record(out / "record.json", {
        "method": "per link, a fresh kvtier per codec and repeat (every block cold), one Lookup + one Read of a "
                  "128-block chain, timed from the Lookup to the Read's last byte; codecs alternate (reversed on odd "
                  "repeats); medians; the link probed with netlab.py's TCP source/sink on a shaped port in the "
                  "same run; ratio = payload / stored bytes from the server's counters at fill time",
        "link": a.link if a.link == "lab" else "kernel HTB on loopback",
        "rtt_ms_configured": a.rtt if a.link == "lab" else None, "rtt_ms_measured": rtt,
        "blocks": a.blocks, "block_mib": a.block_mib, "data": a.data or "synthetic kv_like_bf16 (notes/063)",
        "stored": res["stored"], "rows": rows, "phases": res["phases"],
        "validation": {"all_intact": all(r["all_intact"] for r in rows)},
    }, head)
    (out / "summary.md").write_text(summary(rec))
    print(summary(rec))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_inside":
        ip = argparse.ArgumentParser()
        ip.add_argument("_inside")
        for f in ("--kvtier", "--work", "--data", "--rates", "--minio-host"):
            ip.add_argument(f, required=True)
        for f in ("--blocks", "--block-mib", "--repeat"):
            ip.add_argument(f, type=int, required=True)
        ip.add_argument("--shape", action="store_true")
        ip.add_argument("--probed", default="")
        inside(ip.parse_args())
        sys.exit(0)
    sys.exit(main())
