"""A bf16 engine whose first forward pass is one token, because kvtier loaded
the rest of its first prompt, runs (python/kvtier/vllm/amx.py): vLLM 0.32's
CPU attention uses AMX tiles without asking Linux for them, and such an
engine died with SIGILL on AMX CPUs until the connector asked. On a CPU
without AMX the test checks only the load."""
from __future__ import annotations

from pathlib import Path

from kvtier.server import Server
from kvtier.vllm.common import chain_keys
from kvtier.vllm.testing import make_model, prompt_tokens

from conftest import events, outputs, run_engine, wait_blocks

BS = 128
P = prompt_tokens(8 * BS + 1, seed=7)  # 8 full blocks + 1 token: the fresh engine computes 1 token


def test_a_bf16_engine_whose_first_step_is_one_token_after_a_load_runs(kvtier_bin, tmp_path):
    model = str(make_model(tmp_path / "bf16", "small", seed=0, dtype="bfloat16"))
    srv = Server.start(binary=kvtier_bin)
    try:
        def spec(st: Path) -> dict:
            return {"model": model, "dtype": "bfloat16", "max_model_len": 2048, "prefix_caching": False,
                    "kv": {"url": srv.grpc, "stats_file": str(st)}, "phases": [{"prompts": [P]}]}

        run_engine(spec(tmp_path / "a.jsonl"), tmp_path / "a")
        ns = events(tmp_path / "a.jsonl", "init")[0]["namespace"]
        from kvtier import Client

        with Client(srv.grpc) as c:
            assert wait_blocks(c, ns, chain_keys(P, BS)) == 8, "the first engine's 8 blocks never reached kvtier"
        # The fresh engine: without the connector's request its worker dies of SIGILL here on an AMX CPU.
        res, log = run_engine(spec(tmp_path / "b.jsonl"), tmp_path / "b")
        out = outputs(res)[0]
        assert out["num_cached_tokens"] == 8 * BS, (out["num_cached_tokens"], log[-3000:])
        assert len(out["token_ids"]) > 0
    finally:
        srv.stop()
