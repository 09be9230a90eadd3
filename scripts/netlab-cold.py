#!/usr/bin/env python3
"""Cold prefix reads from an object store behind a real RTT (notes/023).

Seed 001's reads were storage-bound: every block a GET of 20-40 ms. This puts
MinIO behind the network lab of scripts/netlab.py (a user-space TUN delay line
between two namespaces; RTT validated by measurement) and kvtier plus the
client on the other side, on loopback, as a node and its engine are:

    client --loopback-- kvtier serve ==== 20 ms lab link ==== MinIO

For each block size, a 256-block chain is written once through kvtier
(write-through, so it is in the store). Then each repeat starts a fresh
`kvtier serve` per mode (empty memory, no disk: every block is cold) and
times what an engine does: one Lookup of the whole chain and one Read of it.
The modes differ only in how the server fetches from the store:

- serial: one GET at a time (object_store.read_ahead = 1, prefetch off);
- parallel-4 / parallel-16: the prefix read keeps 4 / 16 GETs in flight,
  blocks still handed out in order (read_ahead = 4, the old default; 16);
- prefetch: read_ahead = 16, and the Lookup starts the fetches before the
  Read asks (object_store.prefetch, the default);
- default: the defaults of server and Python client together (the client
  also stripes the Read over 8 data-plane connections);
- parallel-16+gap / prefetch+gap (`--modes`): as parallel-16 and prefetch,
  but the Read is sent 200 ms after the Lookup returns, as an engine that
  looks up a step before it loads; the gap is left out of the time.

The bound it is held to (notes/023, "The bound"): a cold 256-block read within 3 x (one
RTT + the chain's bytes at the link's measured rate).

Writes OUT/record.json and OUT/summary.md. Needs root and MinIO
(scripts/setup.sh --test). Re-run:

  cargo build --release -p kvtier
  python3 scripts/netlab-cold.py --rtt 20 --rate 300mbit --repeat 3 --out notes/023-cold-path
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _perf import ROOT

from perf import header, versions, write_record
from perf.services import MINIO_PASSWORD, MINIO_USER, Minio, Server, create_bucket, kvtier_server

_spec = importlib.util.spec_from_file_location("netlab", ROOT / "scripts" / "netlab.py")
assert _spec is not None and _spec.loader is not None
netlab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(netlab)

MINIO_PORT = 9000
BUCKET = "kvtier-cold"
BLOCKS = 256
GRPC_PORT = 7711  # kvtier in the client namespace; data plane on the next port, HTTP on the one after

MODES: dict[str, dict[str, Any]] = {
    "serial": {"read_ahead": 1, "prefetch": False, "stripes": 1},
    "parallel-4": {"read_ahead": 4, "prefetch": False, "stripes": 1},
    "parallel-16": {"read_ahead": 16, "prefetch": False, "stripes": 1},
    "prefetch": {"read_ahead": 16, "prefetch": True, "stripes": 1},
    "default": {"read_ahead": 16, "prefetch": True, "stripes": 0},  # 0: the client's default
    # An engine that looks up a step before it reads (vLLM: the scheduler's
    # lookup, the worker's load in the next step): the Read is sent gap_ms
    # after the Lookup returns; the gap is not part of the time.
    "parallel-16+gap": {"read_ahead": 16, "prefetch": False, "stripes": 1, "gap_ms": 200},
    "prefetch+gap": {"read_ahead": 16, "prefetch": True, "stripes": 1, "gap_ms": 200},
}
DEFAULT_MODES = "serial,parallel-4,parallel-16,prefetch,default"


def server_ip() -> str:
    return netlab.SERVER_IP.split("/")[0]


# -- in the client namespace ------------------------------------------------

def write_config(path: Path, read_ahead: int, prefetch: bool, policy: str) -> None:
    path.write_text(f"""[object_store]
url = "s3://{BUCKET}/cold"
write_policy = "{policy}"
read_ahead = {read_ahead}
prefetch = {"true" if prefetch else "false"}
[object_store.options]
aws_endpoint = "http://{server_ip()}:{MINIO_PORT}"
aws_allow_http = "true"
aws_access_key_id = "{MINIO_USER}"
aws_secret_access_key = "{MINIO_PASSWORD}"
aws_region = "us-east-1"
""")


def start_kvtier(kvtier: str, config: Path) -> Server:
    """kvtier on loopback in this (the client's) namespace, empty memory, no disk: every block is cold."""
    return kvtier_server(kvtier, ["--config", str(config), "--insecure", "--data-listen", "auto",
                                  "--memory-capacity", "3GiB"], listen=f"127.0.0.1:{GRPC_PORT}")


def stop(srv: Server, log: Path) -> None:
    """Stops the server, its log appended to `log`."""
    with open(log, "a") as f:
        f.write(srv.stderr_text())
    srv.stop(30)


def object_counters(http_addr: str) -> dict:
    host, port = http_addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=5)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        for name in ("gets", "fetches", "fetches_joined", "prefetched", "heads"):
            if line.startswith(f"kvtier_object_{name}_total "):
                out[name] = int(float(line.split()[1]))
    return out


def chain(size: int) -> tuple[list[bytes], list[bytes]]:
    keys = [hashlib.sha256(f"cold-{size}-{i}".encode()).digest() for i in range(BLOCKS)]
    payloads = [hashlib.sha256(k).digest() * (size // 32) + b"\0" * (size % 32) for k in keys]
    return keys, payloads


def client_run(a) -> None:
    import kvtier

    work = Path(a.work)
    create_bucket(server_ip(), MINIO_PORT, BUCKET)
    sizes = [int(x) for x in a.sizes.split(",")]
    modes = a.modes.split(",")
    log = work / "server.log"
    results = []
    for size in sizes:
        ns = f"cold/{size}"
        keys, payloads = chain(size)
        cfg = work / "fill.toml"
        write_config(cfg, 16, False, "write-through")
        p = start_kvtier(a.kvtier, cfg)
        try:
            c = kvtier.Client(f"127.0.0.1:{GRPC_PORT}", timeout=300)
            for i in range(0, BLOCKS, 16):
                c.write(ns, [kvtier.Block(key=keys[j], payload=payloads[j],
                                          parent=keys[j - 1] if j else None, token_count=128)
                             for j in range(i, i + 16)])
            c.close()
        finally:
            stop(p, log)
        for rep in range(a.repeat):
            for mode in modes:
                m = MODES[mode]
                cfg = work / f"{mode}.toml"
                write_config(cfg, m["read_ahead"], m["prefetch"], "write-back")
                p = start_kvtier(a.kvtier, cfg)
                try:
                    kw = {"read_stripes": m["stripes"]} if m["stripes"] else {}
                    c = kvtier.Client(f"127.0.0.1:{GRPC_PORT}", timeout=300, **kw)
                    c.lookup(ns, keys=[b"warm-up-" + bytes(24)])  # connections up; not part of the time
                    t0 = time.monotonic()
                    found = c.lookup(ns, keys=keys).found
                    t1 = time.monotonic()
                    gap = m.get("gap_ms", 0) / 1000
                    if gap:
                        time.sleep(gap)  # the engine's step between lookup and load (the modelled workload)
                    t1g = time.monotonic()
                    r = c.read(ns, keys)
                    t2 = time.monotonic()
                    got = [bytes(b.payload) for b in r.blocks]
                    ok = found == BLOCKS and got == payloads
                    assert p.http, "the server's HTTP listener (metrics) is off"
                    counters = object_counters(p.http)
                    c.close()
                finally:
                    stop(p, log)
                e = {"value_size": size, "mode": mode, **m, "repeat": rep, "found": found,
                     "returned": len(got), "intact": ok, "lookup_s": t1 - t0, "gap_s": t1g - t1,
                     "read_s": t2 - t1g, "total_s": (t1 - t0) + (t2 - t1g), "counters": counters}
                results.append(e)
                print(json.dumps(e), file=sys.stderr, flush=True)
    print(json.dumps(results))


# -- the orchestrator (root namespace) --------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rtt", type=float, default=20.0)
    ap.add_argument("--rate", default="300mbit")
    ap.add_argument("--sizes", default="1258291,131072", help="block sizes in bytes")
    ap.add_argument("--modes", default=DEFAULT_MODES, help=f"of {', '.join(MODES)}")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kvtier", default=str(ROOT / "target" / "release" / "kvtier"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the lab needs root (network namespaces and TUN devices)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rate = netlab.parse_rate(a.rate)
    head = header(versions=versions("kvtier", "minio", paths={"kvtier": a.kvtier}))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with netlab.Lab(str(os.getpid() % 100000)) as lab, tempfile.TemporaryDirectory() as tmp:
        lab.set_link(0, None)
        base = lab.rtt(20)
        lab.set_link(a.rtt, rate, base)
        measured = lab.rtt()
        ok = netlab.validate_rtt(a.rtt, measured)
        one = lab.throughput(1, 5.0)["gbit_s"] * 1000
        many = lab.throughput(8, 5.0)["gbit_s"] * 1000
        link = max(one, many)
        print(f"rtt {a.rtt:g} ms: measured {measured:.2f} ({'ok' if ok else 'OFF'}); probe 1 stream "
              f"{one:.0f} Mbit/s, 8 streams {many:.0f} Mbit/s", flush=True)
        # MinIO in the server namespace: this process cannot reach it; the client side creates the bucket.
        minio = Minio.start(Path(tmp), host=server_ip(), port=MINIO_PORT, console_port=MINIO_PORT + 1,
                            wrap=["ip", "netns", "exec", lab.server_ns], log=out / "minio.log", probe=False)
        try:
            py = ROOT / ".venv/bin/python"  # the Python SDK's dependencies (make test creates it)
            r = subprocess.run(["ip", "netns", "exec", lab.client_ns, str(py if py.exists() else sys.executable),
                                __file__, "_client",
                                "--kvtier", str(Path(a.kvtier).resolve()), "--work", str(out),
                                "--sizes", a.sizes, "--modes", a.modes, "--repeat", str(a.repeat)],
                               stdout=subprocess.PIPE, text=True)
            if r.returncode != 0:
                raise SystemExit(f"the client side failed ({r.returncode}); see {out / 'server.log'}")
            results = json.loads(r.stdout)
        finally:
            minio.stop(30)
    for p in out.glob("*.toml"):
        p.unlink()
    for p in out.glob("*.ready"):
        p.unlink()
    rows = []
    for size in sorted({e["value_size"] for e in results}, reverse=True):
        bytes_ = size * BLOCKS
        bound = 3 * (measured / 1000 + bytes_ * 8 / (link * 1e6))
        for mode in a.modes.split(","):
            es = [e for e in results if e["value_size"] == size and e["mode"] == mode]
            med = statistics.median(e["total_s"] for e in es)
            rows.append({"value_size": size, "mode": mode, "total_s_per_repeat": [e["total_s"] for e in es],
                         "total_s": med, "lookup_s": statistics.median(e["lookup_s"] for e in es),
                         "read_s": statistics.median(e["read_s"] for e in es),
                         "goodput_mbit_s": bytes_ * 8 / med / 1e6, "bound_s": bound, "within_bound": med <= bound,
                         "floor_s": bound / 3, "of_floor": med / (bound / 3),
                         "all_intact": all(e["intact"] for e in es)})
    record = write_record(out / "record.json", {
        "method": "scripts/netlab.py's lab with MinIO in the server namespace; kvtier serve and the Python client "
                  "on loopback in the client namespace; per repeat and mode a fresh kvtier (every block cold), "
                  "one Lookup + one Read of a 256-block chain, timed from the Lookup to the Read's last byte; "
                  "medians over repeats; floor = one measured RTT + the chain's bytes at the best lab probe; "
                  "bound = 3 x floor (notes/023)",
        "rtt_ms_configured": a.rtt, "rtt_ms_measured": measured, "rtt_ok": ok, "base_rtt_ms": base,
        "rate_mbit": rate / 1e6 if rate else None, "link_mbit_s_1_stream": one, "link_mbit_s_8_streams": many,
        "link_mbit_s": link, "blocks": BLOCKS, "modes": {m: MODES[m] for m in a.modes.split(",")},
        "rows": rows, "runs": results,
        "validation": {"rtt_ok": ok, "all_intact": all(e["intact"] for e in results)},
    }, head)
    (out / "summary.md").write_text(summary(record))
    print(summary(record))
    return 0


def summary(rec: dict) -> str:
    lines = [f"Cold 256-block prefix reads from MinIO behind {rec['rtt_ms_measured']:.1f} ms RTT "
             f"(configured {rec['rtt_ms_configured']:g}), link {rec['link_mbit_s']:.0f} Mbit/s measured, "
             f"`{rec['command']}` at {(rec.get('commit') or rec['git_commit'])[:10]}, {rec['date']}.", "",
             "Lookup + Read, seconds (median of repeats); floor = one RTT + the chain at the link's rate; "
             "the bound is 3 x floor.", "",
             "| block | mode | total s (repeats) | lookup s | read s | Mbit/s | x floor | within 3 x floor |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        reps = ", ".join(f"{t:.2f}" for t in r["total_s_per_repeat"])
        lines.append(f"| {r['value_size'] / 1e6:.2f} MB | {r['mode']} | **{r['total_s']:.2f}** ({reps}) | "
                     f"{r['lookup_s']:.2f} | {r['read_s']:.2f} | {r['goodput_mbit_s']:.0f} | {r['of_floor']:.2f} | "
                     f"{'yes' if r['within_bound'] else 'no'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        cp = argparse.ArgumentParser()
        cp.add_argument("_client")
        cp.add_argument("--kvtier", required=True)
        cp.add_argument("--work", required=True)
        cp.add_argument("--sizes", required=True)
        cp.add_argument("--modes", required=True)
        cp.add_argument("--repeat", type=int, required=True)
        client_run(cp.parse_args())
        sys.exit(0)
    sys.exit(main())
