"""Load shedding end to end (docs/operations.md, "Admission and load
shedding"; notes/031): the real server under `kvtier bench`
reads far past its knee, with the adaptive concurrency limit and, as the
control, the static limit (which queues).

With the adaptive limit requests are shed (counted in ``kvtier_shed_total``,
answered UNAVAILABLE with a retry hint the bench's workers wait), and the
requests it admits keep a latency near the knee's; the static limit queues
every request, and its p99 grows with the backlog. The knee here is the
single-core knee's neighbourhood (2 readers); the overload is 16x that.
Absolute targets (p99 <= 2x the knee's, throughput >= 90 % of the peak) are
measured pinned, at full size, by scripts/overload-knee.py (notes/031);
this test checks the behaviour with margins a shared CI machine keeps."""
from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

from kvtier.server import Server

SIZE = 256 << 10


def metric(http: str, name: str) -> float:
    text = urllib.request.urlopen(f"http://{http}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def bench(kvtier_bin: Path, server: Server, out: Path, workload: str, c: int, duration: str) -> dict:
    r = subprocess.run(
        [str(kvtier_bin), "bench", "--target", server.grpc, "--workload", workload,
         "--transport", "data-plane", "--value-size", str(SIZE), "--concurrency", str(c),
         "--duration", duration, "--warmup", "300ms", "--retries", "0", "--quiet", "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    o = json.loads((out / "record.json").read_text())["steps"][0]["ops"][workload]
    return {"p99_ms": o["latency_us"]["e2e"]["p99"] / 1000, "ops": o["ops"], "errors": o["errors"]}


def run(kvtier_bin: Path, tmp: Path, mode: str) -> dict:
    server = Server.start(kvtier_bin, ["--memory-capacity", "256MiB", "--concurrency-limit", mode])
    try:
        # The read workload reads what it wrote in its warm-up; the first
        # steps also give the adaptive limit its min_rtt.
        knee = bench(kvtier_bin, server, tmp / f"{mode}-knee", "read", 2, "2s")
        over = bench(kvtier_bin, server, tmp / f"{mode}-over", "read", 32, "3s")
        over["shed"] = metric(server.http, "kvtier_shed_total")
        return {"knee": knee, "over": over}
    finally:
        server.stop()


def test_past_the_knee_the_adaptive_limit_sheds_and_bounds_admitted_latency(kvtier_bin, tmp_path):
    static = run(kvtier_bin, tmp_path, "static")
    adaptive = run(kvtier_bin, tmp_path, "adaptive")
    summary = json.dumps({"static": static, "adaptive": adaptive})
    # The control: queueing, nothing refused, latency grows with the backlog.
    assert static["over"]["errors"] == 0 and static["over"]["shed"] == 0, summary
    assert static["over"]["p99_ms"] > 3 * static["knee"]["p99_ms"], summary
    # The adaptive limit refuses the excess...
    assert adaptive["over"]["shed"] > 0 and adaptive["over"]["errors"] > 0, summary
    # ...and what it admits is served near the knee's latency, far below the queue's.
    assert adaptive["over"]["p99_ms"] < 0.5 * static["over"]["p99_ms"], summary
    # (Here ~3.3x the knee's p99 against the queue's ~13x; pinned, at full
    # size, notes/031 measures 1.5-1.7x.)
    assert adaptive["over"]["p99_ms"] < 6 * adaptive["knee"]["p99_ms"], summary
    # It still serves: most of what the server answered was data, not refusals.
    answered = adaptive["over"]["ops"] - adaptive["over"]["errors"]
    assert answered > adaptive["over"]["errors"], summary
