#!/usr/bin/env python3
"""Load shedding at 10x the knee (docs/operations.md, "Admission and load
shedding"; notes/012, 031), measured with `kvtier bench`.

1. Knee: a closed-loop read sweep (1.2 MB blocks from the memory tier) on a
   server with the static limit (default config: nothing is shed at these
   concurrencies). The knee is the bench's own throughput knee (Kneedle);
   `peak` is the highest median throughput of the sweep.
2. Overload: 10x the knee's concurrency against a fresh static server and a
   fresh `--concurrency-limit adaptive` server, same binary, same run. The
   generator runs with `--retries 0`: every attempt is a sample, a shed
   request counts as an error and its worker backs off 10-20 ms (the
   client's first back-off) before its next request; latency figures are
   those of admitted (answered) requests.
3. Write flood: 32 closed-loop writers of 1.2 MB blocks against a server
   with a 512 MiB memory tier, over the data plane and over gRPC; the
   server's peak RSS is sampled every 20 ms.

Verdicts are computed here from the bench records: admitted p99 at 10x the
knee <= 2x the p99 at the knee, throughput >= 90 % of the peak, RSS within
the memory budget + 10 % + the fixed overhead measured on the idle server.

usage: python3 scripts/overload-knee.py [--kvtier target/release/kvtier]
       [--sweep 1,2,4,8,16] [--duration 4s] [--repeat 3]
       [--transports data-plane,grpc] [--pin] [--no-flood]
       [--out notes/012-load-shedding.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from _perf import ROOT

from perf import Sampler, header, versions, write_record
from perf.services import Server, kvtier_server

MIB = 1 << 20
# --pin: the server's threads on CPU 0, the generator on CPU 1 (taskset), so
# neither takes the other's core and the server's own queueing is what it sees.
PIN = False


def metric(http: str, name: str, labels: str = "") -> float:
    body = urllib.request.urlopen(f"http://{http}/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
            return float(line.split()[-1])
    return 0.0


def bench(binary: Path, srv: Server, out: Path, args: list[str]) -> dict:
    cmd = [str(binary), "bench", "--target", f"grpc://{srv.grpc}", "-q", "--out", str(out), *args]
    if PIN:
        cmd = ["taskset", "-c", "1", *cmd]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    rec = json.loads((out / "record.json").read_text())
    rec["_cmd"] = cmd
    return rec


def step_summary(step: dict, op: str) -> dict:
    o = step["ops"][op]
    reps = o.get("per_repeat") or []
    # The bench's throughput counts every completed attempt; admitted
    # (answered) throughput is its share of successes (the record keeps
    # errors per step, not per repeat).
    ok_share = (o["ops"] - o["errors"]) / o["ops"] if o["ops"] else 0.0
    tput = [r["throughput_ops_s"] * ok_share for r in reps] or [o["throughput_ops_s"] * ok_share]
    p99 = [r["e2e_us"]["p99"] for r in reps if r.get("e2e_us")] or [o["latency_us"]["e2e"]["p99"]]
    return {
        "concurrency": step["mode"].get("concurrency"),
        "ops": o["ops"],
        "errors": o["errors"],
        "admitted_ops_s_median": statistics.median(tput),
        "admitted_ops_s_repeats": tput,
        "p99_ms_median": statistics.median(p99) / 1000,
        "p99_ms_repeats": [v / 1000 for v in p99],
        "p50_ms": o["latency_us"]["e2e"]["p50"] / 1000 if o["latency_us"].get("e2e") else None,
        "generator_cpu_utilisation": step.get("generator_cpu_utilisation"),
        # Where an answered request's time went, all repeats pooled: the
        # server's queue (socket wait + admission) and service, and the rest
        # of its round trip ("network": sending the reply, the generator
        # reading it).
        "phases_us": {ph: {"p50": v["p50"], "p99": v["p99"]}
                      for ph, v in o["latency_us"].items()
                      if ph != "e2e" and isinstance(v, dict) and "p99" in v},
        "flags": [f.get("kind") for f in step.get("flags", [])],
    }


def serve(binary: Path, tmp: Path, mode: str, memory: str) -> Server:
    # Pinned: the server starts on CPU 0, so its runtime sizes itself to that
    # one CPU. Pinning a running server instead (taskset -a -p) leaves it with
    # one worker per CPU it started with, all on one core (notes/028: a ~4 ms
    # p99 step).
    return kvtier_server(binary, ["--memory-capacity", memory, "--concurrency-limit", mode],
                         cpus={0} if PIN else None)


def overload(binary: Path, tmp: Path, mode: str, c: int, common: list[str]) -> dict:
    front = "grpc" if "grpc" in common else "data"
    srv = serve(binary, tmp, mode, "1GiB")
    try:
        assert srv.http, "the server's HTTP listener (metrics) is off"
        # RSS every 20 ms, and the server's CPU time over the bench's whole run (warm-up included).
        with Sampler(srv.pid, 0.02) as rss:
            rec = bench(binary, srv, tmp / f"over-{mode}-{front}",
                        ["--workload", "read", "--concurrency", str(c), *common])
        s = step_summary(rec["steps"][0], "read")
        s["server_cpu_utilisation"] = rss.result()["cpu_utilisation"]
        s["server_shed_total"] = metric(srv.http, "kvtier_shed_total")
        s["limit_at_end"] = metric(srv.http, "kvtier_concurrency_limit", f'{{front="{front}"}}')
        s["server_rss_mib"] = {"idle": rss.rss_before, "peak": rss.rss_peak}
        s["command"] = rec["_cmd"]
        return s
    finally:
        srv.stop()


def flood(binary: Path, tmp: Path, transport: str, duration: str) -> dict:
    srv = serve(binary, tmp, "static", "512MiB")
    try:
        time.sleep(0.5)
        with Sampler(srv.pid, 0.02) as rss:
            rec = bench(
                binary, srv, tmp / f"flood-{transport}",
                ["--workload", "write", "--concurrency", "32", "--transport", transport,
                 "--duration", duration, "--warmup", "1s"],
            )
        peak = rss.rss_peak
        s = step_summary(rec["steps"][0], "write")
        budget = 512.0
        s.update({
            "memory_capacity_mib": budget,
            "server_rss_mib": {"idle": rss.rss_before, "peak": peak},
            "ratio_to_budget": peak / budget,
            # The idle server's RSS is the fixed overhead (binary, runtime, allocator arenas).
            "within_budget_plus_10pct_plus_idle": peak <= budget * 1.10 + rss.rss_before,
            "command": rec["_cmd"],
        })
        return s
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvtier", default=str(ROOT / "target/release/kvtier"))
    ap.add_argument("--sweep", default="1,2,4,8,16")
    ap.add_argument("--duration", default="4s")
    ap.add_argument("--repeat", default="3")
    ap.add_argument("--transports", default="data-plane,grpc",
                    help="Read transports to measure, each with its own knee")
    ap.add_argument("--out", default=str(ROOT / "notes/012-load-shedding.json"))
    ap.add_argument("--pin", action="store_true",
                    help="server started on CPU 0, generator on CPU 1")
    ap.add_argument("--no-flood", action="store_true", help="skip the write flood")
    a = ap.parse_args()
    global PIN
    PIN = a.pin
    binary = Path(a.kvtier)
    head = header(versions=versions("kvtier", paths={"kvtier": binary}))
    results = {tr: measure(binary, a, tr) for tr in a.transports.split(",")}
    floods = {}
    if not a.no_flood:
        with tempfile.TemporaryDirectory(prefix="kvtier-flood-") as t:
            floods = {tr: flood(binary, Path(t), tr, a.duration) for tr in ("data-plane", "grpc")}
    write_record(a.out, {"pinned": PIN, "reads": results, "write_flood_32": floods}, head, indent=2)
    print(json.dumps({"verdicts": {tr: r["verdict_at_10x_knee"] for tr, r in results.items()},
                      "knees": {tr: r["knee"] for tr, r in results.items()},
                      "flood": {k: (v["server_rss_mib"], v["ratio_to_budget"]) for k, v in floods.items()}},
                     indent=2))


def knee_of(rec: dict, steps: list[dict]) -> tuple[int, str]:
    """The sweep's throughput knee (the bench's Kneedle) and where it came
    from. A curve Kneedle finds no knee in (flat, or still rising at the
    last step) falls back to the lowest concurrency within 90 % of the
    sweep's peak throughput: past it, more concurrency buys < 10 %."""
    for k in rec["analysis"]["knees"]:
        if k["op"] == "read" and k["curve"] == "throughput":
            return int(k["concurrency"]), "kneedle"
    if not steps:
        raise SystemExit("the knee sweep produced no steps: nothing to find a knee in")
    peak = max(s["admitted_ops_s_median"] for s in steps)
    first = min(s["concurrency"] for s in steps if s["admitted_ops_s_median"] >= 0.9 * peak)
    return int(first), "lowest concurrency within 90% of the peak (no Kneedle knee)"


def measure(binary: Path, a, transport: str) -> dict:
    common = ["--duration", a.duration, "--warmup", "1s", "--repeat", a.repeat, "--retries", "0",
              "--transport", transport]
    with tempfile.TemporaryDirectory(prefix="kvtier-knee-") as t:
        tmp = Path(t)
        sweeps = {}
        for mode in ("static", "adaptive"):
            srv = serve(binary, tmp, mode, "1GiB")
            try:
                rec = bench(binary, srv, tmp / f"sweep-{mode}-{transport}",
                            ["--workload", "read", "--concurrency", a.sweep, *common])
            finally:
                srv.stop()
            steps = [step_summary(s, "read") for s in rec["steps"]]
            kc, source = knee_of(rec, steps)
            sweeps[mode] = {"steps": steps, "knee_concurrency": kc, "knee_source": source,
                            "command": rec["_cmd"]}
        base = sweeps["static"]
        kc = base["knee_concurrency"]
        knee_step = next(s for s in base["steps"] if s["concurrency"] == kc)
        peak = max(s["admitted_ops_s_median"] for s in base["steps"])
        c10 = 10 * kc
        over = {mode: overload(binary, tmp, mode, c10, common) for mode in ("static", "adaptive")}
    verdict = {}
    for mode, o in over.items():
        verdict[mode] = {
            "admitted_p99_over_knee_p99": o["p99_ms_median"] / knee_step["p99_ms_median"],
            "p99_within_2x": o["p99_ms_median"] <= 2 * knee_step["p99_ms_median"],
            "throughput_over_peak": o["admitted_ops_s_median"] / peak,
            "throughput_within_90pct": o["admitted_ops_s_median"] >= 0.9 * peak,
            "shed": o["errors"],
        }
    return {
        "knee": {"concurrency": kc, "p99_ms": knee_step["p99_ms_median"],
                 "throughput_ops_s": knee_step["admitted_ops_s_median"], "peak_ops_s": peak},
        "sweeps": sweeps,
        "at_10x_knee": {"concurrency": c10, **over},
        "verdict_at_10x_knee": verdict,
    }


if __name__ == "__main__":
    main()
