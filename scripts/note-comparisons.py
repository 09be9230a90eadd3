#!/usr/bin/env python3
"""Generates a comparison note's perf record (notes/013-comparisons.json,
notes/026-comparisons.json), the tables of its .md and the comparison table of notes/README.md from the bench records
that scripts/bench-data-plane.sh wrote (OUT/read/record.json,
OUT/write/record.json). Every number and verdict here comes from the records'
`analysis.comparison` rows (computed by kvtier bench, crates/kvtier-bench/src/analysis/fair.rs);
nothing is typed in by hand.

Usage: scripts/note-comparisons.py OUT [--command "how OUT was produced"]
       [--note notes/026-comparisons] [--readme notes/README.md]
"""
import argparse
import json
import os
import pathlib
import re
import shlex
from typing import Any

import _perf  # noqa: F401 (puts perf on sys.path)

from perf import header, versions, write_record

# The targets README's headline table and notes/026 quote, as kvtier / the
# peer's best number (docs/bench.md, "Comparisons", rule 2).
TARGETS: dict[str, dict[str, Any]] = {
    "write": {"throughput_ratio_min": 1.0, "p99_ratio_max": 1.0},
    "read": {"throughput_ratio_min": 1.2, "p99_ratio_max": None},
}
BEGIN, END = "<!-- generated:begin -->", "<!-- generated:end -->"
README_BEGIN, README_END = "<!-- comparisons:begin -->", "<!-- comparisons:end -->"


def verdict(op, row):
    if row["throughput_ratio"] is None:
        return "excluded"
    t = TARGETS[op]
    ok = row["throughput_ratio"] >= t["throughput_ratio_min"]
    if t["p99_ratio_max"] is not None and row["p99_ratio"] is not None:
        ok = ok and row["p99_ratio"] <= t["p99_ratio_max"]
    return "met" if ok else "not met"


def ms(us):
    return "–" if us is None else f"{us / 1000:.2f}"


def x(v):
    return "–" if v is None else f"{v:.2f}×"


def ops(v):
    return "–" if v is None else f"{v:,.0f}"


def load(out):
    recs = {}
    for w in ("read", "write"):
        p = out / w / "record.json"
        recs[w] = json.loads(p.read_text())
        assert recs[w]["schema_version"] == 2, f"{p}: schema {recs[w]['schema_version']}"
    return recs


def peer_versions(recs):
    """{"redis": "7.0.15", "mooncake-store": "0.3.13.post1"} from the peers' names in the bench records."""
    out = {}
    for r in recs.values():
        for p in r["peers"]:
            name, _, version = p["name"].rpartition(" ")
            if name and version[:1].isdigit():
                out[name] = version
    return out


def rows_of(recs):
    rows = []
    for w, r in recs.items():
        for c in r["analysis"]["comparison"]:
            rows.append(dict(c, workload=w, verdict=verdict(c["op"], c)))
    return rows


def generator_cpu(rec, system, step):
    steps = rec["steps"] if system == "kvtier" else next(
        (p["steps"] for p in rec["peers"] if p["name"] == system), [])
    for s in steps:
        if label(s) == step:
            return s["generator_cpu_utilisation"]
    return None


def label(s):
    m = s["mode"]
    if m["kind"] == "closed":
        c = m["concurrency"] * s["processes"]
        return f"c={c}" if s["processes"] == 1 else f"c={c} ({s['processes']}×{m['concurrency']})"
    return f"rate={m['rate_per_s']}/s"


def tables(recs, rows):
    out = []
    r0 = recs["read"]
    net = {w: r.get("network") or {} for w, r in recs.items()}
    ccs = sorted({cc for n in net.values() for v in (n.get("observed_cc") or {}).values() for cc in v})
    m = r0["machine"]
    out.append(f"Run {r0['date']} at commit `{(r0.get('git_commit') or 'unknown')[:10]}` on "
               f"{m['hostname']} (generator pinned to {m['cores']} core(s), kernel {m['kernel']}); value size "
               f"{r0['value_size']:,} bytes; congestion control seen on every system's sockets: "
               f"{', '.join(ccs) or 'not observed'} (system default "
               f"{net['read'].get('system_default_cc', '?')}).\n")
    out.append("Peers: " + "; ".join(
        f"**{p['name']}** — {p.get('client') or 'bench client'}"
        + (f"; own tool `{p['reference']['tool']}`" if p.get("reference") else "; no own tool ran")
        for p in recs["read"]["peers"]) + ".\n")
    for w in ("read", "write"):
        t = TARGETS[w]
        goal = f"≥ {t['throughput_ratio_min']}× throughput" + (
            f" and p99 ≤ {t['p99_ratio_max']}×" if t["p99_ratio_max"] else "")
        out.append(f"### {w}s (target: {goal} the peer's best number)\n")
        out.append("| step | peer | kvtier ops/s | peer client ops/s | peer tool ops/s | denominator | ratio | kvtier p99 ms | peer p99 ms | p99 ratio | target | gen. CPU kvtier / peer | notes |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in [r for r in rows if r["workload"] == w]:
            notes = ["excluded: " + e for e in r["excluded"]] + r["outliers"]
            gk = generator_cpu(recs[w], "kvtier", r["step"])
            gp = generator_cpu(recs[w], r["peer"], r["step"])
            gen = " / ".join("–" if g is None else f"{g * 100:.0f}%" for g in (gk, gp))
            out.append(
                f"| {r['step']} | {r['peer']} {r['peer_op']} | {ops(r['kvtier_ops_s'])} | "
                f"{ops(r['peer_client_ops_s'])} | {ops(r['peer_tool_ops_s'])} | {r['peer_best_source']} | "
                f"{x(r['throughput_ratio'])} | {ms(r['kvtier_p99_us'])} | {ms(r['peer_best_p99_us'])} | "
                f"{x(r['p99_ratio'])} | {r['verdict']} | {gen} | {'; '.join(notes)} |")
        out.append("")
    out.append("Per-repeat ops/s (kvtier | peer client), for the outlier check:\n")
    out.append("| workload | step | peer | kvtier repeats | peer repeats |")
    out.append("|---|---|---|---|---|")
    def rep(v):
        return ", ".join(f"{a:,.0f}" for a in v) or "–"

    for r in rows:
        out.append(f"| {r['workload']} | {r['step']} | {r['peer']} | {rep(r['kvtier_repeats_ops_s'])} | "
                   f"{rep(r['peer_client_repeats_ops_s'])} |")
    out.append("")
    counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("met", "not met", "excluded")}
    out.append(f"Targets: {counts['met']} rows met, {counts['not met']} not met, {counts['excluded']} excluded.\n")
    return "\n".join(out), counts


def readme_table(rows, recs):
    peers = sorted({r["peer"] for r in rows})
    lines = [
        "| 1.2 MB, memory hits | " + " | ".join(f"vs {p}" for p in peers) + " |",
        "|---|" + "---|" * len(peers),
    ]
    for w in ("read", "write"):
        steps = []
        for r in rows:
            if r["workload"] == w and r["step"] not in steps:
                steps.append(r["step"])
        for s in steps:
            cells = []
            for p in peers:
                r = next((r for r in rows if r["workload"] == w and r["step"] == s and r["peer"] == p), None)
                if r is None:
                    cells.append("–")
                elif r["throughput_ratio"] is None:
                    why = r["excluded"][0].split(":")[0].split(" used ")[0].replace(r["peer"], "peer")
                    cells.append(f"no ratio: {why} saturated or failed "
                                 f"({ops(r['kvtier_ops_s'])} vs {ops(r['peer_best_ops_s'])} ops/s)")
                else:
                    cells.append(f"**{r['throughput_ratio']:.2f}×** ops/s, p99 {x(r['p99_ratio'])} "
                                 f"({ops(r['kvtier_ops_s'])} vs {ops(r['peer_best_ops_s'])})")
            lines.append(f"| {w} {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def splice(text, begin, end, body):
    pat = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pat.search(text):
        raise SystemExit(f"markers {begin} … {end} not found")
    return pat.sub(lambda _: f"{begin}\n{body}\n{end}", text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--command", default="")
    ap.add_argument("--note", default="notes/026-comparisons")
    ap.add_argument("--readme", default="notes/README.md")
    a = ap.parse_args()
    recs = load(a.out)
    rows = rows_of(recs)
    body, counts = tables(recs, rows)
    r0 = recs["read"]
    # The header: the bench's run (date, commit) on this machine, right after it (bench-data-plane.sh).
    head = header(command=a.command or shlex.join(recs["read"]["command_line"]),
                  versions=versions("kvtier", paths={"kvtier": recs["read"]["command_line"][0]},
                                    known=peer_versions(recs)))
    if r0.get("git_commit") and r0["git_commit"] != head["commit"]:
        head["commit"], head["dirty"] = r0["git_commit"], None  # run at another commit: its state is unknown
    head["date"] = r0["date"]
    head["machine"] = {**head["machine"], "generator_cores": r0["machine"]["cores"]}
    record = {
        "git_commit": r0.get("git_commit"),
        "bench_command_lines": {w: r["command_line"] for w, r in recs.items()},
        "network": {w: r.get("network") for w, r in recs.items()},
        "peers": {w: [{"name": p["name"], "client": p.get("client"), "tool": (p.get("reference") or {}).get("tool")}
                      for p in r["peers"]] for w, r in recs.items()},
        "targets": TARGETS,
        "rows": rows,
        "verdicts": counts,
        "link_probe_gbit_s": {w: (r.get("link_probe") or {}).get("gbit_per_s") for w, r in recs.items()},
    }
    note = pathlib.Path(a.note)
    write_record(note.with_suffix(".json"), record, head)
    md = note.with_suffix(".md")
    md.write_text(splice(md.read_text(), BEGIN, END, body))
    readme = pathlib.Path(a.readme)
    conditions = (f"Same run, {r0['date'][:10]}: server and peers on one core, generators on the other, "
                  f"every system on the same congestion control, the peer's best of its bench client and own tool, "
                  f"medians of {len(rows[0]['kvtier_repeats_ops_s']) if rows else 0} alternating repeats "
                  f"([{note.name[:3]}]({os.path.relpath(note.with_suffix('.md'), readme.parent)}), "
                  "`scripts/bench-data-plane.sh`). "
                  f"Ratios are kvtier / peer; \"excluded\" marks a step whose generator saturated or that had errors.")
    readme.write_text(splice(readme.read_text(), README_BEGIN, README_END,
                             conditions + "\n\n" + readme_table(rows, recs)))
    print(f"wrote {note.with_suffix('.json')}, {md} and {readme}: {counts}")


if __name__ == "__main__":
    main()
