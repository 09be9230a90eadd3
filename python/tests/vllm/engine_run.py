"""Runs a real vLLM engine (CPU build) on a spec and writes its outputs as JSON.

Each connector test starts this in a fresh process, as a user's engine would
be: ``python engine_run.py SPEC.json OUT.json``. The spec names the model, the
KV-transfer config (or none for the baseline) and phases of prompts, run one
``generate`` call after another in the same engine. A phase may first wait for
a file the test creates (``wait_for``: the test changes something outside,
e.g. starts kvtier) and clear vLLM's own prefix cache (``reset_prefix_cache``);
after it, ``done`` names a file this script creates with the phase's outputs.
"""
from __future__ import annotations

import json
import os
import sys
import time


def main(spec_path: str, out_path: str) -> None:
    spec = json.load(open(spec_path))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.get("kv_cache_gib", 1)))
    sys.path[:0] = spec.get("sys_path", [])
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = {}
    if spec.get("kv") is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector=spec.get("connector_class", "KvtierConnector"),
            kv_connector_module_path=spec.get("connector_module", "kvtier.vllm"),
            kv_role=spec.get("kv_role", "kv_both"),
            kv_connector_extra_config=spec["kv"],
        )
    t0 = time.monotonic()
    llm = LLM(
        model=spec["model"],
        dtype=spec.get("dtype", "float32"),
        block_size=spec.get("block_size", 128),
        max_model_len=spec.get("max_model_len", 4096),
        enforce_eager=True,
        gpu_memory_utilization=spec.get("memory_utilization", 0.3),
        enable_prefix_caching=spec.get("prefix_caching", True),
        max_num_batched_tokens=spec.get("max_num_batched_tokens"),
        seed=0,
        **kw,
    )
    out = {"load_s": time.monotonic() - t0, "phases": []}
    for phase in spec["phases"]:
        if phase.get("wait_for"):
            end = time.monotonic() + 300
            while not os.path.exists(phase["wait_for"]):
                if time.monotonic() > end:
                    raise SystemExit(f"{phase['wait_for']} did not appear within 300 s")
                time.sleep(0.05)
        params = SamplingParams(max_tokens=phase.get("max_tokens", 4), temperature=0.0,
                                logprobs=phase.get("logprobs", 5), seed=0)
        # ``until``: repeat the phase until the test creates that file (it probes
        # something outside, e.g. that kvtier received the blocks).
        end = time.monotonic() + 300
        while True:
            if phase.get("reset_prefix_cache"):
                assert llm.reset_prefix_cache(), "vLLM refused to reset its prefix cache"
            t = time.monotonic()
            results = llm.generate([{"prompt_token_ids": p} for p in phase["prompts"]], params, use_tqdm=False)
            elapsed = time.monotonic() - t
            if not phase.get("until") or os.path.exists(phase["until"]):
                break
            if time.monotonic() > end:
                raise SystemExit(f"{phase['until']} did not appear within 300 s")
        out["phases"].append({
            "elapsed_s": elapsed,
            "outputs": [
                {
                    "token_ids": list(r.outputs[0].token_ids),
                    "logprobs": [{str(k): v.logprob for k, v in step.items()} for step in (r.outputs[0].logprobs or [])],
                    "num_cached_tokens": r.num_cached_tokens or 0,
                }
                for r in results
            ],
        })
        if phase.get("done"):
            with open(phase["done"] + ".tmp", "w") as f:
                json.dump(out["phases"][-1], f)
            os.rename(phase["done"] + ".tmp", phase["done"])
    json.dump(out, open(out_path, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
