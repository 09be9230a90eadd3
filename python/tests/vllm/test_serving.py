"""Serving through vLLM's OpenAI server, its own benchmark client and a
router, with kvtier shared by the engines (docs/serving.md):

* the short version of the serving benchmark (``scripts/bench-serving.py
  --quick``): two replicas behind a round-robin router, vLLM alone against
  vLLM + kvtier on the same trace; kvtier must raise the hit rate and lower
  TTFT;
* the prefill/decode split: a ``kv_producer`` engine prefills, a
  ``kv_consumer`` engine loads the prefix from kvtier and decodes; its
  output equals one engine's and it computes none of the prefix's full
  blocks.
"""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kvtier.server import REPO_ROOT, find_binary

from conftest import TOL

SCRIPT = REPO_ROOT / "scripts" / "bench-serving.py"


def test_two_replicas_with_kvtier_hit_more_than_vllm_alone_on_the_same_trace(tmp_path):
    # TTFT is compared in the benchmark (notes/048), not here: on CI's two
    # cores one quick run's p50 flipped order (102.6 vs 89.3 ms) at unchanged code.
    out = tmp_path / "serving.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--workdir", str(tmp_path / "run"),
         "--kvtier-bin", str(find_binary())],
        capture_output=True, text=True, timeout=1500, cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rec = json.loads(out.read_text())
    for key in ("date", "commit", "dirty", "machine", "command", "versions"):
        assert key in rec, f"the record lacks the header key {key}"
    bound = rec["traces"][0]["infinite_cache_hit_rate"]
    steps = {r["system"]: r["steps"][0] for r in rec["runs"]}
    alone, kv = steps["alone"], steps["kvtier"]
    for name, s in steps.items():
        assert s["completed"] == rec["traces"][0]["requests"] and s["failed"] == 0, (name, s)
        assert s["hit_rate"] <= bound + 1e-9, f"{name} hit more than an infinite cache could: {s['hit_rate']} > {bound}"
        assert len(s["routed"]) == 2 and min(s["routed"].values()) >= 1, f"both replicas served: {s['routed']}"
    assert alone["external_hit_rate"] == 0
    assert kv["external_hit_rate"] > 0.1, kv
    assert kv["hit_rate"] > alone["hit_rate"] + 0.1, (kv["hit_rate"], alone["hit_rate"])
    assert kv["hit_rate"] >= 0.9 * bound, (kv["hit_rate"], bound)


def _complete(url: str, model: str, prompt: list[int], max_tokens: int) -> dict:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "logprobs": 5}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_prefill_decode_split_through_kvtier_matches_one_engine(tmp_path, models, arch):
    """``gemma3``: a hybrid model (five sliding-window layers per global one,
    window 128 tokens) with vLLM's hybrid KV-cache manager on: its loads are
    async and its windows partial, and the split works as for full attention."""
    sys.path.insert(0, str(REPO_ROOT))
    from perf.serving.engines import ReplicaSpec
    from perf.serving.run import System, deploy

    from kvtier.vllm.testing import make_model, prompt_tokens

    bs = 64
    model = models["m1"] if arch == "llama" else str(make_model(tmp_path / "gemma3", "small", arch="gemma3",
                                                                   window=2 * bs))
    models = {"m1": model}
    # A hybrid model's blocks are shared by its 6 KV-cache groups: vLLM's
    # estimate for 64 was a 576-token model length.
    spec = ReplicaSpec(model=model, block_size=bs, num_blocks=64 if arch == "llama" else 384,
                       max_model_len=(62 if arch == "llama" else 32) * bs)
    prompts = [prompt_tokens(n, seed=40 + i) for i, n in enumerate((5 * bs + 17, 3 * bs + 1, 7 * bs + 40))]
    want = []
    with deploy(System("alone"), "one", spec, tmp_path / "alone", cpus=[[0]]) as dep:
        for p in prompts:
            want.append(_complete(dep.router, models["m1"], p, 6)["choices"][0])
    # The producer's writes reach kvtier 1.5 s late: the decoder must wait for them.
    slow = System("kvtier", kvtier="memory", connector=("SlowSaveConnector", "slow_save_connector"),
                  env={"KVTIER_TEST_SAVE_DELAY_S": "1.5"}, path=[str(Path(__file__).parent)])
    with deploy(slow, "pd", spec, tmp_path / "pd", find_binary(), cpus=[[0], [1]]) as dep:
        producer, consumer = dep.replicas
        before = consumer.metrics()
        got = [_complete(dep.router, models["m1"], p, 6)["choices"][0] for p in prompts]
        after = consumer.metrics()
        routed = json.loads(urllib.request.urlopen(dep.router + "/stats").read())["requests"]
    assert routed == {producer.url: 3, consumer.url: 3}, routed
    for i, (g, w) in enumerate(zip(got, want)):
        assert g["text"] == w["text"], f"prompt {i}: {g['text']!r} != {w['text']!r}"
        worst = 0.0
        for gs, ws in zip(g["logprobs"]["top_logprobs"], w["logprobs"]["top_logprobs"]):
            common = set(gs) & set(ws)
            assert common, f"prompt {i}: no common top token"
            worst = max(worst, *(abs(gs[t] - ws[t]) for t in common))
        assert worst <= TOL, f"prompt {i}: logprobs differ by {worst:.2e}"
    full = sum(len(p) // bs * bs for p in prompts)
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    loaded = after["external_hits"] - before["external_hits"]
    local = after["local_hits"] - before["local_hits"]
    assert prompt == sum(len(p) for p in prompts)
    assert loaded == full, f"the decoder loaded {loaded} tokens, the prompts' full blocks are {full}"
    assert local == 0
    # what it computed itself: only each prompt's partial last block
    assert prompt - loaded == sum(len(p) % bs for p in prompts)
    awaited = [json.loads(line) for f in dep.stats_files for line in Path(f).read_text().splitlines()
               if '"awaited"' in line]
    assert awaited and all(not a.get("timeout") for a in awaited), awaited
