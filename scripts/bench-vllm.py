#!/usr/bin/env python3
"""Time to first token of a real vLLM engine with and without kvtier.

Re-runs notes/009-vllm-ttft: a ~240M-parameter Llama with random weights,
created locally (``kvtier.vllm.testing``), on vLLM's CPU build; prompts of
1k, 4k and 16k tokens; the prefix served from kvtier's memory tier, its disk
tier (kvtier restarted: memory empty) and the object store (Azurite; kvtier
restarted with its disk wiped); load modes sync / async / layer-wise. For each
cached run the connector's stats give the split (Lookup, read, copy into
vLLM's cache), and the first token's logprobs are compared with the baseline.

    .tools/vllm/bin/python scripts/bench-vllm.py [--out notes/009-vllm-ttft.json]
        [--sizes 1024,4096,16384] [--repeats 3] [--modes sync,async,layerwise]
        [--paths tcp] [--tiers memory,disk,object] [--model-size base] [--dtype float32]

``--paths tcp,local`` runs each mode's engine once per path: ``tcp``, kvtier
without a same-host socket (the data plane over loopback TCP), and
``local``, kvtier with ``--local-listen`` (the connector moves to it by
itself; docs/local.md). Each cached run also measures its floor: the
prefix's bytes copied once by ``memcpy`` (numpy, in the engine's process)
plus the engine's one-token step at that context (the same cached prompt
asked for two tokens instead of one).

Needs: scripts/setup-vllm.sh (the venv), scripts/setup.sh --test (Azurite),
cargo (builds target/release/kvtier). Each engine runs in its own process
(this script with --engine), as users run them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _perf import ROOT

from kvtier.server import free_port_pair
from perf import HEADER_KEYS, header, median, median_or_none, packages, versions, write_record
from perf.services import Azurite


def kvtier_config(path: Path, disk: Path, azurite: Azurite) -> Path:
    path.write_text(f"""
[engine]
memory_capacity = "4GiB"
[disk]
dir = "{disk}"
capacity = "8GiB"
sync = "batch"
[object_store]
url = "az://kvtier/vllm-bench"
write_policy = "write-through"
[object_store.options]
azure_storage_account_name = "{azurite.account}"
azure_storage_account_key = "{azurite.key}"
azure_storage_endpoint = "{azurite.endpoint}"
azure_allow_http = "true"
""")
    return path


# -- one engine (runs in its own process) -----------------------------------------

def engine_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "3")
    # vLLM's CPU worker keeps cores back for other work: 1 without a KV
    # connector, 2 with one, which on a 2-core machine falls back to computing
    # on both. Reserving none gives every engine the same cores.
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    from kvtier import Client
    from kvtier.vllm.common import chain_keys
    from kvtier.vllm.testing import prompt_tokens
    from perf.services import kvtier_server

    stats_path = Path(spec["workdir"]) / f"stats-{spec['name']}.jsonl"
    server = None
    kw = {}
    server_args = ["--config", spec["config"]]
    if spec.get("path") == "local":
        server_args += ["--local-listen", str(Path(spec["workdir"]) / "kvtier.sock")]
    if spec["mode"] != "baseline":
        server = kvtier_server(spec["kvtier_bin"], server_args, listen=spec["url"])
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm", kv_role="kv_both",
            kv_connector_extra_config={"url": spec["url"], "stats_file": str(stats_path), "load_mode": spec["mode"]},
        )
    t0 = time.monotonic()
    llm = LLM(model=spec["model"], dtype=spec["dtype"], block_size=128, max_model_len=max(spec["sizes"]) + 256,
              enforce_eager=True, gpu_memory_utilization=0.5, seed=0, **kw)
    load_s = time.monotonic() - t0
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5)

    def stat_lines():
        return [json.loads(line) for line in stats_path.read_text().splitlines()] if stats_path.exists() else []

    def run(tokens):
        llm.reset_prefix_cache()
        mark = len(stat_lines())
        t = time.monotonic()
        r = llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)[0]
        ttft = time.monotonic() - t
        new = stat_lines()[mark:]
        lookup: dict = next((e for e in new if e["event"] == "lookup"), {})
        load: dict = next((e for e in new if e["event"] == "load"), {})
        lp = {str(k): v.logprob for k, v in r.outputs[0].logprobs[0].items()}
        return {"ttft_s": ttft, "cached_tokens": r.num_cached_tokens or 0, "logprobs": lp,
                "token": r.outputs[0].token_ids[0], "lookup_us": lookup.get("us"), "tiers": lookup.get("tiers"),
                "read_us": load.get("read_us"), "copy_us": load.get("copy_us"), "loaded": load.get("loaded"),
                "load_error": load.get("error"), "bytes": load.get("bytes")}

    def restart(wipe_disk: bool):
        nonlocal server
        assert server is not None, "restart() is for the kvtier engines"
        server.stop()
        if wipe_disk:
            shutil.rmtree(spec["disk"])
            os.makedirs(spec["disk"])
        server = kvtier_server(spec["kvtier_bin"], server_args, listen=spec["url"])

    params2 = SamplingParams(max_tokens=2, temperature=0.0, seed=0)

    def floor(tokens, nbytes):
        """The cached run's floor: ``nbytes`` copied once, plus one decode
        step at this context (two tokens minus one token, both cached)."""
        import numpy as np

        src = np.ones(max(1, int(nbytes or 0)), dtype=np.uint8)
        dst = np.empty_like(src)
        copies = []
        for _ in range(5):
            t = time.perf_counter()
            np.copyto(dst, src)
            copies.append(time.perf_counter() - t)
        one, two = [], []
        for _ in range(3):
            one.append(run(tokens)["ttft_s"])
            llm.reset_prefix_cache()
            t = time.monotonic()
            llm.generate([{"prompt_token_ids": tokens}], params2, use_tqdm=False)
            two.append(time.monotonic() - t)
        step = max(0.0, statistics.median(two) - statistics.median(one))
        return {"memcpy_s": statistics.median(copies), "bytes": nbytes, "step_s": step,
                "floor_s": statistics.median(copies) + step}

    warm = prompt_tokens(256, seed=999)
    run(warm)  # the first generate of an engine pays one-off costs
    results = {"name": spec["name"], "mode": spec["mode"], "path": spec.get("path", "tcp"), "load_s": load_s,
               "sizes": {}}
    for size in spec["sizes"]:
        prompt = prompt_tokens(size, seed=size)
        entry = results["sizes"].setdefault(str(size), {})
        if spec["mode"] == "baseline":
            n = spec["repeats"] if size < 16384 else spec["long_repeats"]
            entry["recompute"] = [run(prompt) for _ in range(n)]
            continue
        first = run(prompt)  # stores the prompt's blocks (or finds them from an earlier engine)
        entry["first"] = first
        ns = next(e for e in stat_lines() if e["event"] == "init")["namespace"]
        keys = chain_keys(prompt, 128)
        with Client(spec["url"]) as c:
            end = time.monotonic() + 600
            while c.lookup(ns, keys=keys).found < len(keys):
                if time.monotonic() > end:
                    raise SystemExit("blocks never reached kvtier")
                time.sleep(0.1)
        for tier in spec["tiers"]:
            runs = []
            for _ in range(spec["repeats"]):
                if tier in ("disk", "object"):
                    restart(wipe_disk=tier == "object")
                    run(warm)  # reconnects the engine's pooled connections after the restart
                runs.append(run(prompt))
            entry[tier] = runs
            if tier == "memory":
                entry["floor"] = floor(prompt, median_or_none([x["bytes"] for x in runs]))
    if server is not None:
        server.stop()
    Path(spec["out"]).write_text(json.dumps(results))


# -- the whole measurement ---------------------------------------------------------

def max_diff(a: dict, b: dict):
    common = set(a) & set(b)
    return max(abs(a[k] - b[k]) for k in common) if common else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="notes/009-vllm-ttft.json")
    ap.add_argument("--workdir", default="out/bench-vllm")
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--long-repeats", type=int, default=2,
                    help="recompute repeats for prompts of 16k tokens or more (minutes each on a CPU)")
    ap.add_argument("--modes", default="sync,async,layerwise")
    ap.add_argument("--paths", default="tcp", help="tcp, local or both: kvtier without or with its same-host socket")
    ap.add_argument("--tiers", default="memory,disk,object", help="the sync engines' tiers")
    ap.add_argument("--model-size", default="base")
    ap.add_argument("--only", default="",
                    help="comma-separated engines to (re)run into an existing --workdir, e.g. baseline")
    ap.add_argument("--from-results", action="store_true",
                    help="rebuild the record from the result-*.json files of an earlier run in --workdir")
    ap.add_argument("--dtype", default="float32",
                    help="float32 by default: on CPUs without AVX-512 BF16 (this project's machines) bf16 prefill is ~3x slower")
    args = ap.parse_args()
    if args.engine:
        return engine_main(args.engine)

    from kvtier.vllm.testing import make_model

    work = (ROOT / args.workdir).resolve()
    model_dir = ROOT / "out" / f"bench-vllm-model-{args.model_size}"
    model = make_model(model_dir, args.model_size, seed=0)
    from safetensors.torch import load_file

    n_params = sum(t.numel() for t in load_file(str(model / "model.safetensors")).values())
    if args.from_results:
        spec0 = json.loads((work / "spec-baseline.json").read_text())
        runs = {p.stem.removeprefix("result-"): json.loads(p.read_text()) for p in sorted(work.glob("result-*.json"))}
        return write_note_record(args, runs, n_params, run_info(work), spec0["dtype"])
    only = [x for x in args.only.split(",") if x]
    if only and not (work / "run.json").exists():
        raise SystemExit(f"--only needs the earlier run in {work}")
    if not only and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if not only:
        # The run's header, taken at its start (a later --only or --from-results writes the record).
        (work / "run.json").write_text(json.dumps(header(versions=versions(known=packages("vllm", "torch")))))
    kvtier_bin = ROOT / "target/release/kvtier"
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "kvtier"], cwd=ROOT, check=True)
    azurite = Azurite.start(work / "azurite")
    azurite.create_container("kvtier")
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    port = free_port_pair()
    disk = work / "disk"
    disk.mkdir(exist_ok=True)
    config = kvtier_config(work / "kvtier.toml", disk, azurite)

    runs = {}
    tiers_sync = args.tiers.split(",")
    paths = args.paths.split(",")
    plan: list[tuple[str, str, list[str], str]] = [("baseline", "baseline", [], "tcp")] + [
        (m if path == "tcp" else f"{m}-{path}", m, tiers_sync if m == "sync" else ["memory"], path)
        for path in paths for m in modes]
    try:
        for name, mode, tiers, path in plan:
            if only and name not in only:
                runs[name] = json.loads((work / f"result-{name}.json").read_text())
                continue
            spec = {"name": name, "mode": mode, "path": path, "tiers": tiers, "sizes": sizes, "repeats": args.repeats,
                    "long_repeats": args.long_repeats,
                    "model": str(model), "dtype": args.dtype, "url": f"127.0.0.1:{port}", "config": str(config),
                    "disk": str(disk), "kvtier_bin": str(kvtier_bin), "workdir": str(work),
                    "out": str(work / f"result-{name}.json")}
            sp = work / f"spec-{name}.json"
            sp.write_text(json.dumps(spec))
            print(f"== engine {name} ({mode}, {path}, tiers {tiers})", flush=True)
            with open(work / f"engine-{name}.log", "w") as log:
                subprocess.run([sys.executable, __file__, "--engine", str(sp)], stdout=log, stderr=subprocess.STDOUT,
                               check=True, cwd=ROOT)
            runs[name] = json.loads((work / f"result-{name}.json").read_text())
    finally:
        azurite.stop()
    info = run_info(work)
    if only:
        now = header()
        info["reruns"] = info.get("reruns", []) + [{
            "engines": only, **{k: now[k] for k in ("date", "commit", "dirty", "command")}}]
        (work / "run.json").write_text(json.dumps(info))
    write_note_record(args, runs, n_params, info, args.dtype)


def run_info(work: Path) -> dict:
    """The header of the run in ``work`` (taken at its start), and its reruns."""
    p = work / "run.json"
    if p.exists():
        return json.loads(p.read_text())
    return {**dict.fromkeys(HEADER_KEYS), "command": "unknown (run.json missing)"}


def write_note_record(args, runs: dict, n_params: int, info: dict, dtype: str) -> None:
    """The perf record, built from the engines' raw results.

    Recompute TTFT, the ratio's denominator, is the faster of two
    measurements: the engine without kvtier (median of its repeats) and the
    sync engine's own first run of the prompt, a miss that computes and stores
    (same process as the cached runs; engines started at different times on
    this shared VM differ by up to ~2x)."""
    from kvtier.vllm.testing import SIZES

    base = runs["baseline"]["sizes"]
    miss = {size: e["first"]["ttft_s"] for size, e in runs.get("sync", {"sizes": {}})["sizes"].items() if "first" in e}
    rows = []
    for name, r in runs.items():
        if name == "baseline":
            continue
        for size, entry in r["sizes"].items():
            baseline_median = median([x["ttft_s"] for x in base[size]["recompute"]])
            recompute = min(baseline_median, miss.get(size, baseline_median))
            ref_lp = base[size]["recompute"][0]["logprobs"]
            for tier in ("memory", "disk", "object"):
                xs = entry.get(tier)
                if not xs:
                    continue
                ttft = median([x["ttft_s"] for x in xs])
                fl = entry.get("floor") if tier == "memory" else None
                rows.append({
                    "mode": r["mode"], "path": r.get("path", "tcp"), "tier": tier, "prompt_tokens": int(size),
                    "floor": fl, "ratio_to_floor": ttft / fl["floor_s"] if fl and fl["floor_s"] else None,
                    "ttft_s_median": ttft, "ttft_s_repeats": [x["ttft_s"] for x in xs],
                    "recompute_ttft_s": recompute, "recompute_baseline_engine_s": baseline_median,
                    "recompute_same_engine_miss_s": miss.get(size), "ratio": ttft / recompute,
                    "lookup_ms_median": (median_or_none([x["lookup_us"] for x in xs]) or 0) / 1000,
                    "read_ms_median": (median_or_none([x["read_us"] for x in xs]) or 0) / 1000,
                    "copy_ms_median": (median_or_none([x["copy_us"] for x in xs]) or 0) / 1000,
                    "cached_tokens": [x["cached_tokens"] for x in xs],
                    "tiers_seen": [x["tiers"] for x in xs],
                    "load_errors": [x["load_error"] for x in xs if x["load_error"]],
                    "bytes_loaded": median_or_none([x["bytes"] for x in xs]),
                    "first_token_equal": all(x["token"] == base[size]["recompute"][0]["token"] for x in xs),
                    "max_logprob_diff": max((max_diff(x["logprobs"], ref_lp) or 0) for x in xs),
                })
    head = {k: info.get(k) for k in HEADER_KEYS}
    if isinstance(head["commit"], str) and head["commit"].endswith("-dirty"):  # a run.json from before perf's header
        head["commit"], head["dirty"] = head["commit"][: -len("-dirty")], True
    record = write_record(ROOT / args.out, {
        "note": Path(args.out).stem,
        **{k: v for k, v in info.items() if k not in HEADER_KEYS},
        "model": {"size": args.model_size, "shape": SIZES[args.model_size], "parameters": n_params, "dtype": dtype,
                  "weights": "random (kvtier.vllm.testing.make_model, seed 0)"},
        "engine_load_s": {k: v["load_s"] for k, v in runs.items()},
        "recompute": {size: {"baseline_engine_ttft_s_median": median_or_none([x["ttft_s"] for x in e["recompute"]]),
                             "baseline_engine_ttft_s_repeats": [x["ttft_s"] for x in e["recompute"]],
                             "same_engine_miss_ttft_s": miss.get(size)} for size, e in base.items()},
        "cached": rows,
        "raw": runs,
    }, head)
    print(table(record))


def _floor_ms(r: dict) -> str:
    f = r.get("floor")
    if not f:
        return "–"
    return f"{f['floor_s'] * 1000:.0f} ms ({f['memcpy_s'] * 1000:.0f} + {f['step_s'] * 1000:.0f})"


def _x(v) -> str:
    return "–" if v is None else f"{v:.2f}×"


def table(record: dict) -> str:
    lines = ["| mode | path | tier | prompt | TTFT cached (median) | recompute | ratio | floor | × floor | lookup | read | copy "
             "| first token equal | max logprob diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in record["cached"]:
        lines.append(
            f"| {r['mode']} | {r.get('path', 'tcp')} | {r['tier']} | {r['prompt_tokens']} | "
            f"{r['ttft_s_median'] * 1000:.0f} ms | {r['recompute_ttft_s']:.2f} s | {r['ratio']:.4f}× | "
            f"{_floor_ms(r)} | {_x(r.get('ratio_to_floor'))} | {r['lookup_ms_median']:.1f} ms | "
            f"{r['read_ms_median']:.0f} ms | {r['copy_ms_median']:.0f} ms | {r['first_token_equal']} | "
            f"{r['max_logprob_diff']:.2e} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(table(json.loads(Path(sys.argv[2]).read_text())))
    else:
        main()
