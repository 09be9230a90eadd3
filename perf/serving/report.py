"""The serving note's record and tables, generated from the benchmark's
records (``scripts/bench-serving.py`` runs, one per set of topologies)::

    python3 -m perf.serving.report --out notes/NNN-serving.json --tables notes/NNN-serving.tables.md A.json B.json

The merged record keeps every run and step as measured, each part's own
header, and a ``summary`` with the verdicts against the serving targets
(docs/serving.md, "Targets"): the idle TTFT and the TTFT bound (10× idle),
the highest request rate each system sustains under that bound, kvtier's
TTFT against vLLM alone's at the highest rate vLLM alone sustains, and hit
rates against the trace's infinite-cache bound.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..header import header, write_record

__all__ = ["merge", "summary", "tables"]

#: The TTFT bound that defines a sustained rate, in multiples of the idle TTFT.
BOUND_X = 10.0


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    first = parts[0]
    for p in parts[1:]:
        for key in ("model", "engine", "rates", "trace_spec"):
            if p.get(key) != first.get(key):
                raise ValueError(f"the parts differ in {key}: {p.get(key)} != {first.get(key)}")
    runs = [r for p in parts for r in p["runs"]]
    fields = {
        "what": first["what"],
        "parts": [{k: p[k] for k in ("date", "commit", "dirty", "command")} for p in parts],
        "model": first["model"], "engine": first["engine"], "rates": first["rates"],
        "trace_spec": first["trace_spec"], "traces": first["traces"], "runs": runs,
    }
    fields["summary"] = summary(fields)
    return fields


def _run(rec: dict[str, Any], topo: str, system: str) -> dict[str, Any] | None:
    return next((r for r in rec["runs"] if r["topology"] == topo and r["system"] == system and not r.get("error")),
                None)


def _sustained(run: dict[str, Any], bound_ms: float) -> float | None:
    ok = [s["request_rate"] for s in run["steps"]
          if s["failed"] == 0 and s["p99_ttft_ms"] <= bound_ms]
    return max(ok) if ok else None


def _idle(rec: dict[str, Any], topo: str) -> tuple[float, str] | None:
    """vLLM alone's median TTFT at the lowest rate, in this topology (the
    prefill/decode split takes two replicas'), else one engine's."""
    for t in ((topo, "two", "one") if topo != "pd" else ("two", "one")):
        run = _run(rec, t, "alone")
        if run is not None:
            return min(run["steps"], key=lambda s: s["request_rate"])["median_ttft_ms"], f"{t}/alone"
    return None


def summary(rec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"bound_x_idle": BOUND_X, "idle_ttft_ms": {}, "ttft_bound_ms": {}, "sustained_rate": {},
                           "hit_vs_bound": {}, "targets": {}}
    for r in rec["runs"]:
        if r.get("error"):
            continue
        idle = _idle(rec, r["topology"])
        if idle is None:
            return {"error": "no vLLM-alone run to take the idle TTFT from"}
        key = f"{r['topology']}/{r['system']}"
        out["idle_ttft_ms"][r["topology"]] = {"ms": idle[0], "from": idle[1] + ", lowest rate, p50"}
        out["ttft_bound_ms"][r["topology"]] = BOUND_X * idle[0]
        out["sustained_rate"][key] = _sustained(r, BOUND_X * idle[0])
        out["hit_vs_bound"][key] = [s["hit_rate"] / rec["traces"][s["trace"]]["infinite_cache_hit_rate"]
                                    for s in r["steps"]]
    out["outputs"] = outputs(rec)
    alone, kv = _run(rec, "two", "alone"), _run(rec, "two", "kvtier")
    if alone and kv:
        r_alone = out["sustained_rate"]["two/alone"]
        r_kv = out["sustained_rate"]["two/kvtier"]
        t = out["targets"]
        if r_alone is not None:
            a = next(s for s in alone["steps"] if s["request_rate"] == r_alone)
            k = next(s for s in kv["steps"] if s["request_rate"] == r_alone)
            t["rate_compared"] = r_alone
            t["ttft_p50_ratio"] = k["median_ttft_ms"] / a["median_ttft_ms"]
            t["ttft_p99_ratio"] = k["p99_ttft_ms"] / a["p99_ttft_ms"]
            t["ttft_p50_met"] = t["ttft_p50_ratio"] <= 0.3
            t["ttft_p99_met"] = t["ttft_p99_ratio"] <= 0.3
        top = max(rec["rates"])
        t["sustained_alone"], t["sustained_kvtier"] = r_alone, r_kv
        t["sustained_kvtier_is_sweep_top"] = r_kv == top
        if r_alone and r_kv:
            t["sustained_ratio"] = r_kv / r_alone
            t["sustained_ratio_met"] = t["sustained_ratio"] >= 2
        hv = out["hit_vs_bound"]["two/kvtier"]
        t["hit_vs_bound_min"] = min(hv)
        t["hit_vs_bound_met"] = min(hv) >= 0.9
    return out


def outputs(rec: dict[str, Any]) -> dict[str, Any]:
    """Every run's checked outputs against vLLM alone's on the same prompts
    (same topology if it ran there, else one engine): same first token, and
    the largest difference of a top-5 logprob both have."""
    res: dict[str, Any] = {}
    for r in rec["runs"]:
        if r.get("error") or r["system"] == "alone" or not r.get("outputs"):
            continue
        ref = _run(rec, r["topology"], "alone") or _run(rec, "one", "alone") or _run(rec, "two", "alone")
        if ref is None or not ref.get("outputs"):
            continue
        same, worst = 0, 0.0
        for got, want in zip(r["outputs"], ref["outputs"]):
            g0, w0 = got["top_logprobs"][0], want["top_logprobs"][0]
            same += max(g0, key=g0.get) == max(w0, key=w0.get)
            for g, w in zip(got["top_logprobs"], want["top_logprobs"]):
                for tok in set(g) & set(w):
                    worst = max(worst, abs(g[tok] - w[tok]))
        res[f"{r['topology']}/{r['system']}"] = {
            "against": f"{ref['topology']}/alone", "checked": min(len(r["outputs"]), len(ref["outputs"])),
            "same_first_token": same, "max_logprob_diff": worst}
    return res


def repeats(rec: dict[str, Any], again: dict[str, Any]) -> list[dict[str, Any]]:
    """The two-replica rows of a second run (``again``, systems in another
    order) beside the first: p50 and p99 of each run and their mean."""
    rows = []
    for r2 in again["runs"]:
        r1 = _run(rec, r2["topology"], r2["system"])
        if r2.get("error") or r1 is None:
            continue
        for s2 in r2["steps"]:
            s1 = next((x for x in r1["steps"] if x["request_rate"] == s2["request_rate"]), None)
            if s1 is None:
                continue
            rows.append({"topology": r2["topology"], "system": r2["system"], "request_rate": s2["request_rate"],
                         "p50_ms": [s1["median_ttft_ms"], s2["median_ttft_ms"]],
                         "p99_ms": [s1["p99_ttft_ms"], s2["p99_ttft_ms"]],
                         "p50_mean_ms": (s1["median_ttft_ms"] + s2["median_ttft_ms"]) / 2,
                         "p99_mean_ms": (s1["p99_ttft_ms"] + s2["p99_ttft_ms"]) / 2,
                         "hit_rate": [s1["hit_rate"], s2["hit_rate"]]})
    return rows


def _f(v: float | None, fmt: str = "{:.0f}") -> str:
    return "–" if v is None else fmt.format(v)


def tables(rec: dict[str, Any]) -> str:
    s = rec["summary"]
    bounds = "; ".join(f"{t}: idle {v['ms']:.0f} ms ({v['from']}), bound {s['ttft_bound_ms'][t]:.0f} ms"
                       for t, v in s["idle_ttft_ms"].items())
    lines = [
        f"A rate is sustained when no request fails and TTFT p99 ≤ {s['bound_x_idle']:g}× the idle TTFT of its "
        f"topology ({bounds}). Trace bound = the hit rate a cache that never evicts would give on the same trace.",
        "",
        "| topology | system | req/s offered | TTFT p50 ms | p90 | p99 | ITL p50 ms | req/s done | output tok/s "
        "| hit rate (local + kvtier/peer) | of trace bound |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rec["runs"]:
        if r.get("error"):
            continue
        for st in r["steps"]:
            b = rec["traces"][st["trace"]]["infinite_cache_hit_rate"]
            lines.append(
                f"| {r['topology']} | {r['system']} | {st['request_rate']:g} | {st['median_ttft_ms']:.0f} | "
                f"{st['p90_ttft_ms']:.0f} | {st['p99_ttft_ms']:.0f} | {_f(st.get('median_itl_ms'), '{:.1f}')} | "
                f"{st['request_throughput']:.2f} | {st['output_throughput']:.1f} | {st['hit_rate']:.2f} "
                f"({st['local_hit_rate']:.2f} + {st['external_hit_rate']:.2f}) | {st['hit_rate'] / b:.2f} |")
    lines += ["", "| topology/system | highest rate sustained (req/s) |", "|---|---|"]
    for k, v in s["sustained_rate"].items():
        lines.append(f"| {k} | {_f(v, '{:g}')} |")
    if s.get("outputs"):
        lines += ["", "| topology/system | against | prompts checked | same first token | largest logprob difference |",
                  "|---|---|---|---|---|"]
        for k, v in s["outputs"].items():
            lines.append(f"| {k} | {v['against']} | {v['checked']} | {v['same_first_token']} | "
                         f"{v['max_logprob_diff']:.1e} |")
    if rec.get("repeat"):
        order = " → ".join(r["system"] for r in rec["repeat"]["runs"])
        lines += ["", f"Second run, systems in reversed order ({order}): TTFT of run 1 / run 2 and their mean.", "",
                  "| system | req/s | p50 ms (run 1 / 2) | p50 mean | p99 ms (run 1 / 2) | p99 mean |",
                  "|---|---|---|---|---|---|"]
        for row in sorted(rec["repeat"]["rows"], key=lambda x: (x["request_rate"], x["system"])):
            lines.append(f"| {row['system']} | {row['request_rate']:g} | {row['p50_ms'][0]:.0f} / {row['p50_ms'][1]:.0f} "
                         f"| {row['p50_mean_ms']:.0f} | {row['p99_ms'][0]:.0f} / {row['p99_ms'][1]:.0f} "
                         f"| {row['p99_mean_ms']:.0f} |")
    errors = [r for r in rec["runs"] if r.get("error")]
    if errors:
        lines += ["", "| peer | could not run here: the error |", "|---|---|"]
        for r in errors:
            lines.append(f"| {r['system']} | `{r['error'].replace('|', '/')}` |")
    return "\n".join(lines) + "\n"


README_BEGIN, README_END = "<!-- serving:begin -->", "<!-- serving:end -->"


_LABELS = {"alone": "vLLM alone", "kvtier": "+ kvtier (memory tier)", "kvtier-disk": "+ kvtier (memory over disk)",
           "example": "+ vLLM's ExampleConnector", "mooncake-store": "+ Mooncake Store",
           "lmcache-mp": "+ LMCache (multi-process)"}


def readme_table(rec: dict[str, Any], note: str) -> str:
    """README's serving table: two replicas at the rate compared (vLLM alone's
    highest sustained rate, else the lowest swept), one row per system."""
    t = rec["summary"].get("targets", {})
    rate = t.get("rate_compared") or min(rec["rates"])
    lines = [f"Two vLLM replicas behind a round-robin router, vLLM's own `vllm bench serve` replaying a "
             f"multi-turn chat trace at {rate:g} req/s ({rec['model']['size']} test model, CPU build, "
             f"one core per engine; [{note}](notes/{note}.md)):", "",
             "| system | TTFT p50 | TTFT p99 | prefix hit rate (trace bound "
             f"{rec['traces'][0]['infinite_cache_hit_rate']:.2f}) |", "|---|---|---|---|"]
    for r in rec["runs"]:
        if r["topology"] != "two" or r.get("error"):
            continue
        st = next((x for x in r["steps"] if x["request_rate"] == rate), None)
        if st is not None:
            lines.append(f"| {_LABELS.get(r['system'], r['system'])} | "
                         f"{st['median_ttft_ms']:.0f} ms | {st['p99_ttft_ms']:.0f} ms | {st['hit_rate']:.2f} |")
    if t.get("sustained_alone") and t.get("sustained_kvtier"):
        lines += ["", f"Highest rate held with TTFT p99 under 10× idle: vLLM alone {t['sustained_alone']:g} req/s, "
                      f"with kvtier {t['sustained_kvtier']:g} req/s."]
    return "\n".join(lines) + "\n"


def splice_readme(readme: Path, body: str) -> None:
    text = readme.read_text()
    a, b = text.index(README_BEGIN), text.index(README_END)
    readme.write_text(text[:a + len(README_BEGIN)] + "\n" + body + text[b:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tables", required=True)
    ap.add_argument("--readme", default="", help="README.md whose serving block is rewritten")
    ap.add_argument("--repeat", default="", help="a second run of the two-replica rows, systems in another order")
    ap.add_argument("parts", nargs="+")
    a = ap.parse_args(argv)
    parts = [json.loads(Path(p).read_text()) for p in a.parts]
    head = header(versions=parts[0]["versions"])
    fields = merge(parts)
    if a.repeat:
        again = json.loads(Path(a.repeat).read_text())
        fields["repeat"] = {"part": {k: again[k] for k in ("date", "commit", "dirty", "command")},
                            "runs": again["runs"], "rows": repeats(fields, again)}
    rec = write_record(a.out, fields, head=head)
    Path(a.tables).write_text(tables(rec))
    print(f"wrote {a.tables}")
    if a.readme:
        splice_readme(Path(a.readme), readme_table(rec, Path(a.out).stem))
        print(f"rewrote the serving block of {a.readme}")
    print(json.dumps(rec["summary"]["targets"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
