#!/usr/bin/env python3
"""Cold prefix reads from an object store behind a real RTT (issue 16, part 3).

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

The bound it is held to (issue 16): a cold 256-block read within 3 x (one
RTT + the chain's bytes at the link's measured rate).

Writes OUT/record.json and OUT/summary.md. Needs root and MinIO
(scripts/setup.sh --test). Re-run:

  cargo build --release -p kvtier
  python3 scripts/netlab-cold.py --rtt 20 --rate 300mbit --repeat 3 --out notes/023-cold-path
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import http.client
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("netlab", ROOT / "scripts" / "netlab.py")
netlab = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(netlab)

MINIO_PORT = 9000
MINIO_USER, MINIO_PASSWORD = "kvtieradmin", "kvtieradmin-secret"
BUCKET = "kvtier-cold"
BLOCKS = 256
GRPC_PORT = 7711  # kvtier in the client namespace; data plane on the next port, HTTP on the one after

MODES = {
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


def minio_path() -> str:
    for p in (os.environ.get("KVTIER_MINIO"), ROOT / ".tools/bin/minio", Path.home() / "go/bin/minio"):
        if p and Path(p).is_file():
            return str(p)
    raise SystemExit("MinIO not found (.tools/bin/minio, ~/go/bin/minio or $KVTIER_MINIO): "
                     "run scripts/setup.sh --test")


# -- in the client namespace ------------------------------------------------

def http_status(host: str, port: int, method: str, path: str, headers: dict | None = None) -> int | None:
    try:
        c = http.client.HTTPConnection(host, port, timeout=2)
        c.request(method, path, headers=headers or {})
        return c.getresponse().status
    except OSError:
        return None


def create_bucket(host: str, port: int, bucket: str) -> None:
    """PUT /bucket signed with AWS SigV4 (object_store never creates buckets)."""
    end = time.monotonic() + 60
    while http_status(host, port, "GET", "/minio/health/ready") != 200:
        if time.monotonic() > end:
            raise SystemExit("MinIO did not become ready across the lab")
        time.sleep(0.1)
    while True:
        amz_date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        date = amz_date[:8]
        hosthdr = f"{host}:{port}"
        ph = hashlib.sha256(b"").hexdigest()
        canonical = (f"PUT\n/{bucket}\n\nhost:{hosthdr}\nx-amz-content-sha256:{ph}\nx-amz-date:{amz_date}\n\n"
                     f"host;x-amz-content-sha256;x-amz-date\n{ph}")
        scope = f"{date}/us-east-1/s3/aws4_request"
        sts = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        k = hmac.new(f"AWS4{MINIO_PASSWORD}".encode(), date.encode(), hashlib.sha256).digest()
        for part in ("us-east-1", "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
        st = http_status(host, port, "PUT", f"/{bucket}", {
            "Host": hosthdr, "x-amz-content-sha256": ph, "x-amz-date": amz_date, "Content-Length": "0",
            "Authorization": f"AWS4-HMAC-SHA256 Credential={MINIO_USER}/{scope}, "
                             f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={sig}"})
        if st in (200, 409):
            return
        if st == 503 and time.monotonic() < end:  # MinIO answers 503 for a moment after ready
            time.sleep(0.1)
            continue
        raise SystemExit(f"creating bucket {bucket}: HTTP {st}")


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


def start_kvtier(kvtier: str, config: Path, log: Path) -> subprocess.Popen:
    ready = config.with_suffix(".ready")
    ready.unlink(missing_ok=True)
    p = subprocess.Popen([kvtier, "serve", "--config", str(config), "--insecure",
                          "--listen", f"127.0.0.1:{GRPC_PORT}", "--data-listen", "auto",
                          "--http-listen", f"127.0.0.1:{GRPC_PORT + 2}", "--memory-capacity", "3GiB",
                          "--ready-json"], stdout=open(ready, "w"), stderr=open(log, "a"))
    end = time.monotonic() + 60
    while not (ready.exists() and ready.stat().st_size > 0):
        if p.poll() is not None or time.monotonic() > end:
            p.kill()
            raise SystemExit(f"kvtier serve did not start; see {log}")
        time.sleep(0.05)
    return p


def stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def object_counters() -> dict:
    c = http.client.HTTPConnection("127.0.0.1", GRPC_PORT + 2, timeout=5)
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
    sys.path.insert(0, str(ROOT / "python"))
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
        p = start_kvtier(a.kvtier, cfg, log)
        try:
            c = kvtier.Client(f"127.0.0.1:{GRPC_PORT}", timeout=300)
            for i in range(0, BLOCKS, 16):
                c.write(ns, [kvtier.Block(key=keys[j], payload=payloads[j],
                                          parent=keys[j - 1] if j else None, token_count=128)
                             for j in range(i, i + 16)])
            c.close()
        finally:
            stop(p)
        for rep in range(a.repeat):
            for mode in modes:
                m = MODES[mode]
                cfg = work / f"{mode}.toml"
                write_config(cfg, m["read_ahead"], m["prefetch"], "write-back")
                p = start_kvtier(a.kvtier, cfg, log)
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
                    counters = object_counters()
                    c.close()
                finally:
                    stop(p)
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
        minio = subprocess.Popen(
            ["ip", "netns", "exec", lab.server_ns, minio_path(), "server", f"{tmp}/data",
             "--address", f"{server_ip()}:{MINIO_PORT}", "--console-address", f"{server_ip()}:{MINIO_PORT + 1}",
             "--quiet"],
            env={**os.environ, "MINIO_ROOT_USER": MINIO_USER, "MINIO_ROOT_PASSWORD": MINIO_PASSWORD,
                 "MINIO_BROWSER": "off", "MINIO_UPDATE": "off"},
            stdout=open(out / "minio.log", "w"), stderr=subprocess.STDOUT)
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
            minio.terminate()
            try:
                minio.wait(30)
            except subprocess.TimeoutExpired:
                minio.kill()
                minio.wait()
    for p in out.glob("*.toml"):
        p.unlink()
    for p in out.glob("*.ready"):
        p.unlink()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], text=True,
                            stdout=subprocess.PIPE).stdout.strip()
    if subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--", "crates"],
                      text=True, stdout=subprocess.PIPE).stdout.strip():
        commit += "-dirty"  # the binary may hold uncommitted changes
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
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "machine": {"hostname": platform.node(), "cores": os.cpu_count(), "kernel": platform.release(),
                    "congestion_control": Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()},
        "command": " ".join(["scripts/netlab-cold.py", *sys.argv[1:]]),
        "method": "scripts/netlab.py's lab with MinIO in the server namespace; kvtier serve and the Python client "
                  "on loopback in the client namespace; per repeat and mode a fresh kvtier (every block cold), "
                  "one Lookup + one Read of a 256-block chain, timed from the Lookup to the Read's last byte; "
                  "medians over repeats; floor = one measured RTT + the chain's bytes at the best lab probe; "
                  "bound = 3 x floor (issue 16)",
        "rtt_ms_configured": a.rtt, "rtt_ms_measured": measured, "rtt_ok": ok, "base_rtt_ms": base,
        "rate_mbit": rate / 1e6 if rate else None, "link_mbit_s_1_stream": one, "link_mbit_s_8_streams": many,
        "link_mbit_s": link, "blocks": BLOCKS, "modes": {m: MODES[m] for m in a.modes.split(",")},
        "rows": rows, "runs": results,
        "validation": {"rtt_ok": ok, "all_intact": all(e["intact"] for e in results)},
    }
    (out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "summary.md").write_text(summary(record))
    print(summary(record))
    return 0


def summary(rec: dict) -> str:
    lines = [f"Cold 256-block prefix reads from MinIO behind {rec['rtt_ms_measured']:.1f} ms RTT "
             f"(configured {rec['rtt_ms_configured']:g}), link {rec['link_mbit_s']:.0f} Mbit/s measured, "
             f"`{rec['command']}` at {rec['git_commit'][:10]}, {rec['date']}.", "",
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
