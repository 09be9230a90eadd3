"""Runs a real vLLM engine (CPU build) on a spec and prints its outputs as JSON.

Each connector test starts this in a fresh process, as a user's engine would
be: ``python engine_run.py SPEC.json OUT.json``. The spec names the model, the
KV-transfer config (or none for the baseline) and phases of prompts, run one
``generate`` call after another in the same engine.
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
        params = SamplingParams(max_tokens=phase.get("max_tokens", 4), temperature=0.0,
                                logprobs=phase.get("logprobs", 5), seed=0)
        t = time.monotonic()
        results = llm.generate([{"prompt_token_ids": p} for p in phase["prompts"]], params, use_tqdm=False)
        elapsed = time.monotonic() - t
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
    json.dump(out, open(out_path, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
