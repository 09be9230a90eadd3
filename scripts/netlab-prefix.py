#!/usr/bin/env python3
"""Long-prefix reads across real round-trip times (notes/020).

In the network lab of scripts/netlab.py (client and server in two namespaces
joined by a user-space TUN delay line), for each RTT:

1. the lab's RTT is measured and validated (within 10 %; at 0: at most 1 ms);
2. the link's own rate is measured in the same run with the lab's TCP probe
   (1 stream and N streams, `--link-streams`), so every kvtier number has the
   link it ran on next to it;
3. `kvtier serve` in the server namespace, `kvtier bench --workload
   prefix-read` (one Lookup + one Read of a 256-block prefix, as an engine
   loading a 32k-token prompt) in the client namespace, once per
   `--read-stripes` setting: 1 is a single data-plane connection, more is the
   client's striping (crates/kvtier-client/src/wire/mod.rs).

Goodput = payload bytes of one prefix read / its median wall time (one
worker, one read at a time); the ratio that matters is each setting's goodput over
the link's best measured rate in the same run.

Writes OUT/record.json and OUT/summary.md. Needs root.

  scripts/netlab-prefix.py --rtt 0,1,10,30 --stripes 1,4,8 --rate 200mbit \\
      --duration 20s --repeat 2 --out out/netlab-prefix
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from _perf import ROOT

from perf import header, stamp_file, versions, write_record
from perf.services import Server, kvtier_server

_spec = importlib.util.spec_from_file_location("netlab", ROOT / "scripts" / "netlab.py")
assert _spec is not None and _spec.loader is not None
netlab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(netlab)

GRPC_PORT = 7611  # the data plane listens on the next port


def in_ns(ns: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, *args], **kw)


def start_server(lab, kvtier: Path) -> Server:
    """kvtier serve in the lab's server namespace (its PID is the server's: `ip netns exec` execs it)."""
    return kvtier_server(kvtier, ["--insecure", "--data-listen", "auto", "--memory-capacity", "3GiB"],
                         listen=f"{netlab.SERVER_IP.split('/')[0]}:{GRPC_PORT}",
                         wrap=["ip", "netns", "exec", lab.server_ns])


def bench(lab, kvtier: Path, out: Path, stripes: int, a, head: dict) -> dict:
    if out.exists():
        shutil.rmtree(out)
    target = f"grpc://{netlab.SERVER_IP.split('/')[0]}:{GRPC_PORT}"
    cmd = [str(kvtier), "bench", "--target", target, "--workload", "prefix-read",
           "--value-size", str(a.value_size), "--read-stripes", str(stripes),
           "--concurrency", "1", "--duration", a.duration, "--warmup", a.warmup,
           "--repeat", str(a.repeat), "--quiet", "--out", str(out)]
    p = in_ns(lab.client_ns, *cmd, stdout=subprocess.DEVNULL, stderr=open(out.parent / "bench.log", "a"))
    if p.wait() != 0:
        raise SystemExit(f"kvtier bench failed; see {out.parent / 'bench.log'}")
    rec = stamp_file(out / "record.json", head)  # the bench's own record, given the run's header
    step = rec["steps"][0]
    op = step["ops"]["prefix-read"]
    # One worker reads one prefix at a time, so a read's wall time is its
    # latency: goodput = payload bytes / median read time (window edges do
    # not count reads twice, as ops/s over a short window would).
    # Timed reads are complete ones (errors are counted, never timed).
    bytes_per_op = a.value_size * 256
    per_repeat = [r["e2e_us"]["p50"] / 1e6 for r in op["per_repeat"] if r["e2e_us"]["count"]]
    return {
        "stripes": stripes,
        "ops": op["ops"], "errors": op["errors"],
        "bytes_per_read": bytes_per_op,
        "goodput_mbit_s_per_repeat": [bytes_per_op * 8 / t / 1e6 for t in per_repeat],
        "goodput_mbit_s": bytes_per_op * 8 / statistics.median(per_repeat) / 1e6 if per_repeat else 0.0,
        "read_ms_p50": op["latency_us"]["e2e"]["p50"] / 1000,
        "read_ms_p99": op["latency_us"]["e2e"]["p99"] / 1000,
        "generator_cpu": step["generator_cpu_utilisation"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rtt", default="0,1,10,30")
    ap.add_argument("--stripes", default="1,4,8")
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--link-streams", type=int, default=8)
    ap.add_argument("--value-size", type=int, default=1258291)
    ap.add_argument("--duration", default="20s")
    ap.add_argument("--warmup", default="3s")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--client-rmem", type=int, default=0,
                    help="cap the client namespace's TCP receive buffer (net.ipv4.tcp_rmem max, bytes): one "
                         "stream's window is then the limit, as on a link whose BDP exceeds the buffers")
    ap.add_argument("--kvtier", default=str(ROOT / "target" / "release" / "kvtier"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the lab needs root (network namespaces and TUN devices)")
    kvtier = Path(a.kvtier).resolve()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    head = header(versions=versions("kvtier", paths={"kvtier": kvtier}))
    rate = netlab.parse_rate(a.rate)
    link_s = 5.0
    entries = []
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with netlab.Lab(str(os.getpid() % 100000)) as lab:
        if a.client_rmem:
            # Per namespace (Linux >= 4.15): the machine's own setting is untouched.
            subprocess.run(["ip", "netns", "exec", lab.client_ns, "sysctl", "-q", "-w",
                            f"net.ipv4.tcp_rmem=4096 {min(131072, a.client_rmem)} {a.client_rmem}"], check=True)
        lab.set_link(0, None)
        base = lab.rtt(20)
        print(f"lab base RTT: {base:.3f} ms", flush=True)
        for rtt in [float(x) for x in a.rtt.split(",") if x.strip()]:
            lab.set_link(rtt, rate, base)
            measured = lab.rtt()
            ok = netlab.validate_rtt(rtt, measured)
            one = lab.throughput(1, link_s)["gbit_s"] * 1000
            many = lab.throughput(a.link_streams, link_s)["gbit_s"] * 1000
            link = max(one, many)
            print(f"rtt {rtt:g} ms: measured {measured:.2f} ({'ok' if ok else 'OFF'}); probe 1 stream "
                  f"{one:.0f} Mbit/s, {a.link_streams} streams {many:.0f} Mbit/s", flush=True)
            server = start_server(lab, kvtier)
            try:
                for s in [int(x) for x in a.stripes.split(",") if x.strip()]:
                    r = bench(lab, kvtier, out / f"rtt{rtt:g}-stripes{s}", s, a, head)
                    r.update({"rtt_ms_configured": rtt, "rtt_ms_measured": measured, "rtt_ok": ok,
                              "link_mbit_s_1_stream": one, f"link_mbit_s_{a.link_streams}_streams": many,
                              "link_mbit_s": link, "of_link": r["goodput_mbit_s"] / link if link else None})
                    entries.append(r)
                    print(f"  stripes {s}: {r['goodput_mbit_s']:.0f} Mbit/s ({r['of_link']:.0%} of the link), "
                          f"read p50 {r['read_ms_p50']:.0f} ms, errors {r['errors']}", flush=True)
            finally:
                with open(out / "server.log", "a") as log:
                    log.write(server.stderr_text())
                server.stop(30)
    record = write_record(out / "record.json", {
        "method": "scripts/netlab.py's lab; kvtier serve in the server namespace, kvtier bench --workload "
                  "prefix-read (one Lookup + one Read of 256 blocks) at concurrency 1 in the client namespace; "
                  "goodput = payload bytes per read / median read time (per repeat, then the median of repeats' "
                  "medians); link = the lab's TCP probe in the same run, best of 1 and N streams",
        "rate_mbit": rate / 1e6 if rate else None, "base_rtt_ms": base, "value_size": a.value_size,
        "client_rmem": a.client_rmem or None,
        "blocks_per_read": 256, "entries": entries,
        "validation": {"rtt_all_ok": all(e["rtt_ok"] for e in entries),
                       "no_errors": all(e["errors"] == 0 for e in entries)},
    }, head)
    (out / "summary.md").write_text(summary(record))
    print(summary(record))
    return 0


def summary(rec: dict) -> str:
    stripes = sorted({e["stripes"] for e in rec["entries"]})
    rtts = sorted({e["rtt_ms_configured"] for e in rec["entries"]})
    rate = f"{rec['rate_mbit']:g} Mbit/s link" if rec["rate_mbit"] else "no rate limit"
    lines = [f"256-block prefix reads ({rec['value_size'] / 1e6:.2f} MB blocks), {rate}, "
             f"`{rec['command']}` at {(rec.get('commit') or rec['git_commit'])[:10]}, {rec['date']}.", "",
             "Goodput in Mbit/s and, in brackets, as a share of the link's best probe in the same run.", "",
             "| RTT (measured) | link probe: 1 stream / best | " + " | ".join(
                 f"{s} stripe{'s' if s > 1 else ''}" for s in stripes) + " |",
             "|---|---|" + "---|" * len(stripes)]
    for rtt in rtts:
        row = [e for e in rec["entries"] if e["rtt_ms_configured"] == rtt]
        by = {e["stripes"]: e for e in row}
        e0 = row[0]
        lines.append(f"| {rtt:g} ms ({e0['rtt_ms_measured']:.2f}) | {e0['link_mbit_s_1_stream']:.0f} / "
                     f"{e0['link_mbit_s']:.0f} | " + " | ".join(
                         f"{by[s]['goodput_mbit_s']:.0f} ({by[s]['of_link']:.0%})" if s in by else "–"
                         for s in stripes) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
