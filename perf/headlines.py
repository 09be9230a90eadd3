"""README's headline numbers, generated from the perf records in notes/.

Rewrites the block between ``<!-- headlines:begin -->`` and
``<!-- headlines:end -->`` in README.md; with ``--check`` changes nothing and
exits 1 if the block differs from what the records give
(python/tests/test_perf_records.py runs that check)::

    python3 -m perf.headlines [--check]

Each row reads its numbers from one record; the note beside it says how they
were measured. A row's choice of record is the current note on its topic
(notes/README.md); moving a headline to a newer note is a change here.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from .ab import HIGH, LOW
from .header import ROOT

README = ROOT / "README.md"
BEGIN, END = "<!-- headlines:begin -->", "<!-- headlines:end -->"


def _load(name: str) -> dict[str, Any]:
    rec = json.loads((ROOT / "notes" / name).read_text())
    assert isinstance(rec, dict)
    return rec


def _link(note: str) -> str:
    md = next((ROOT / "notes").glob(f"{note}-*.md"))
    return f"[{note}](notes/{md.name})"


def _ms(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s" if s < 10 else f"{s:.1f} s" if s < 100 else f"{s:.0f} s"


def engine_ttft() -> list[str]:
    """notes/066: a cached 16k-token prompt from the memory tier over the same-host socket (shared memory)
    against recompute."""
    rec = _load("066-shared-memory.json")["parts"]["066-shared-memory/vllm-unbound.json"]
    row = next(r for r in rec["cached"]
               if (r["mode"], r["path"], r["tier"], r["prompt_tokens"]) == ("sync", "local", "memory", 16384))
    return ["vLLM time to first token, 16k-token prompt cached in kvtier's memory tier over the same-host socket "
            "(CPU build, 184.6M-parameter model)", _ms(row["ttft_s_median"]),
            f"{_ms(row['recompute_ttft_s'])} recomputing it ({row['ratio']:.4f}×), {row['ratio_to_floor']:.2f}× its "
            "floor (one memcpy of the prefix + the one-token step); "
            + ("same first token" if row["first_token_equal"] else "a different first token"),
            _link("066")]


def gpu_ttft() -> list[str]:
    """notes/043: a cached 16k-token prompt on an H200 (Llama-3-8B shape) over the same-host socket."""
    rec = _load("043-gpu-ttft.json")
    row = next(r for r in rec["lengths"] if r["tokens"] == 16384)
    ttft, recompute, load = row["cached"]["ttft_ms"], row["recompute"]["ttft_ms"], row["load"]
    return [f"time to first token, 16k-token prompt cached in kvtier, Llama-3-8B-shaped model on an "
            f"{rec['machine']['gpu'].removeprefix('NVIDIA ')} (same-host socket)",
            f"{ttft:.0f} ms; load {load['gbps']:.1f} GB/s",
            f"{recompute:.0f} ms recomputing it ({ttft / recompute:.2f}×); {load['h2d_floor_gbps']:.0f} GB/s for one "
            f"pinned-to-GPU copy of the same bytes ({load['vs_h2d_floor']:.2f}×)", _link("043")]


def memory_speed() -> list[str]:
    """notes/066: a 512 MiB prefix loaded into a caller's buffer by the Python SDK on the same-host socket
    (shared memory, connections warm)."""
    rec = _load("066-shared-memory.json")["parts"]["066-shared-memory/memory-speed.json"]
    row = rec["results"]["4MiB"]
    local, tcp, moon = row["py-local"]["load"], row["py-tcp"]["load"], row["mooncake"]["load"]
    return ["a 128 × 4 MiB prefix loaded into the caller's buffer by the Python SDK on the same-host socket "
            "(2-CPU machine)", f"{local['gbps_median']:.1f} GB/s ({local['vs_memcpy']:.2f}× memcpy)",
            f"one memcpy of the same bytes; TCP data plane {tcp['gbps_median']:.1f} GB/s, Mooncake Store's "
            f"get_into {moon['gbps_median']:.1f} GB/s in the same run", _link("066")]


def data_plane() -> list[str]:
    """notes/026: c=1 1.2 MB reads and writes against Redis's best number, and Mooncake's rows."""
    rec = _load("026-comparisons.json")
    rows = rec["rows"]

    def ratio(op: str, peer: str) -> dict[str, Any]:
        return next(r for r in rows if r["op"] == op and r["step"] == "c=1" and r["peer"].startswith(peer))

    rd, wr = ratio("read", "redis"), ratio("write", "redis")
    moon = [r for r in rows if r["peer"].startswith("mooncake")]
    moon_note = ("Mooncake Store: no ratio, its client saturated its core at every step"
                 if all(r["throughput_ratio"] is None for r in moon) else "Mooncake Store: see the note")
    peer = rd["peer"]
    return [f"1.2 MB reads / writes at c=1 over the data plane, against {peer}'s best of its bench client and "
            "redis-benchmark", f"{rd['throughput_ratio']:.2f}× / {wr['throughput_ratio']:.2f}×",
            f"{peer} in the same run (target 1.2× / 1.0×); {moon_note}", _link("026")]


def cold_prefix() -> list[str]:
    """notes/023: the shipped defaults' cold 256-block prefix against one RTT + the bytes at the link rate."""
    rec = _load("023-cold-path.json")
    row = next(r for r in rec["rows"] if r["mode"] == "default" and r["value_size"] > 1_000_000)
    return [f"cold {rec['blocks']}-block prefix of {row['value_size'] / 1e6:.2f} MB blocks from MinIO behind a "
            f"{rec['rtt_ms_configured']:.0f} ms, {rec['rate_mbit']:.0f} Mbit/s link (Lookup to last byte)",
            f"{row['total_s']:.2f} s",
            f"{row['of_floor']:.2f}× the floor of one RTT plus the bytes at the measured link rate "
            f"({row['floor_s']:.2f} s)", _link("023")]


def overload() -> list[str]:
    """notes/031: answered p99 at 10x the knee's concurrency, adaptive limit, over the knee's p99."""
    rec = _load("031-retry-hint.json")
    dp = rec["reads"]["data-plane"]["verdict_at_10x_knee"]["adaptive"]
    g = rec["reads"]["grpc"]["verdict_at_10x_knee"]["adaptive"]
    tput = min(dp["throughput_over_peak"], g["throughput_over_peak"])
    return ["answered p99 of 1.2 MB reads at 10× the knee's concurrency, adaptive limit",
            f"{dp['admitted_p99_over_knee_p99']:.2f}× / {g['admitted_p99_over_knee_p99']:.2f}× the knee's",
            f"data plane / gRPC; target ≤ 2×, at {tput * 100:.0f} % of the peak throughput or more", _link("031")]


def cluster() -> list[str]:
    """notes/021: 3 nodes read through the node list against one node on the same cores (steps whose
    one-node repeats hold an outlier excluded), and reads with a node SIGKILLed."""
    rec = _load("021-cluster.json")
    one = next(s for s in rec["scaling"] if (s["nodes"], s["workload"]) == (1, "read"))
    clean = {st["concurrency"] for st in one["steps"]
             if LOW <= st["ops_s_min"] / st["ops_s"] and st["ops_s_max"] / st["ops_s"] <= HIGH}
    eff = [e["speedup"] for e in rec["analysis"]["per_node_efficiency"]
           if (e["nodes"], e["workload"], e["path"]) == (3, "read", "direct") and e["concurrency"] in clean]
    killed = [f for f in rec["failover"] if f["killed"] and f["path"] == "direct"][0]
    return ["3 nodes as one cache on one 2-CPU machine, 1.2 MB reads through the node list",
            f"{min(eff):.2f}–{max(eff):.2f}× one node's throughput",
            f"one node on the same cores (c = {', '.join(map(str, sorted(clean)))}); with a node SIGKILLed "
            f"under load, {killed['errors']} errors "
            f"(max latency {killed['max_ms']:.0f} ms)", _link("021")]


ROWS = [engine_ttft, gpu_ttft, memory_speed, data_plane, cold_prefix, overload, cluster]


def table() -> str:
    lines = ["| headline | kvtier | against | note |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(row()) + " |" for row in ROWS]
    return "\n".join(lines)


def splice(text: str, body: str) -> str:
    pat = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pat.search(text):
        raise SystemExit(f"markers {BEGIN} … {END} not found in {README}")
    return pat.sub(lambda _: f"{BEGIN}\n{body}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if README's block differs; change nothing")
    ap.add_argument("--readme", type=Path, default=README)
    a = ap.parse_args(argv)
    text = a.readme.read_text()
    new = splice(text, table())
    if a.check:
        if new != text:
            print(f"{a.readme}: the headline block is not what `python3 -m perf.headlines` generates", file=sys.stderr)
            return 1
        return 0
    if new != text:
        a.readme.write_text(new)
        print(f"rewrote the headline block of {a.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
