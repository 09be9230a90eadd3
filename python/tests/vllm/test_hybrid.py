"""Hybrid models through the connector, in real vLLM engines (CPU build) with
vLLM's hybrid KV-cache manager left on (docs/vllm.md, "Hybrid models").

Per model (random weights, made here; ``kvtier.vllm.testing.ARCHS``):

* ``baseline``: an engine without kvtier runs P (16 full blocks + 52 tokens)
  and H (shares P's first 8 blocks);
* ``store``: engine A stores P through kvtier;
* ``fresh``: engine B, a new process with vLLM's own prefix cache empty
  (off, or cleared before each prompt), runs P then H: both are loaded from
  kvtier, and their logprobs equal the baseline's.

``mistral-sw`` has one sliding-window group (every layer), moved over TCP;
``gemma3`` five sliding-window groups and one global group, moved over the
same-host socket. A sliding-window group loads only the blocks of its window
at the hit (256 tokens: 2 blocks of 128), the global group all of them.
``granite-hybrid`` (Mamba2 layers and one attention layer, as Granite 4)
loads the global group's blocks and one state block per Mamba layer: the
state at the hit. vLLM keeps Mamba states only with its prefix caching on
("align" mode), and its CPU build only with steps of at most one block, so
those engines run with both. With prefix caching off, a Mamba hybrid is
refused by name and the engine runs with HMA on.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from kvtier import Client
from kvtier.server import Server
from kvtier.vllm.common import chain_keys
from kvtier.vllm.testing import make_model, prompt_tokens

from conftest import assert_same_logprobs, events, outputs, run_engine, wait_blocks

BS = 128
WINDOW = 256
P = prompt_tokens(2100, seed=1)             # 16 full blocks + 52 tokens
H = P[:1024] + prompt_tokens(300, seed=3)   # 10 full blocks; shares P's first 8
HMA_OFF = "Turning off hybrid kv cache manager"


def spec(model: str, kv: dict | None, phases: list[dict], **kw) -> dict:
    return {"model": model, "kv": kv, "phases": phases, "max_model_len": 4096, "block_size": BS, **kw}


def window_blocks(hit_tokens: int) -> int:
    """Blocks a sliding-window group keeps at a hit: vLLM's
    get_num_skipped_tokens (hit - window + 1 skipped tokens)."""
    first = max(0, hit_tokens - WINDOW + 1) // BS
    return -(-hit_tokens // BS) - first


#: Engine settings per model: a Mamba hybrid needs vLLM's prefix caching on
#: (states kept at block boundaries) and, on the CPU build, steps of at most a
#: block (its scan returns no state inside a step).
ENGINE = {"granite-hybrid": {"max_num_batched_tokens": BS}}
#: Prompts run with vLLM's own cache emptied first: off, or cleared per phase.
FRESH = {"granite-hybrid": {"reset_prefix_cache": True}}


def phases(arch: str, prompts: list) -> list[dict]:
    return [{"prompts": [p], **FRESH.get(arch, {})} for p in prompts]


@pytest.fixture(scope="module", params=["mistral-sw", "gemma3", "granite-hybrid"])
def hybrid(request, kvtier_bin, tmp_path_factory):
    """(arch, model, server url, server, baseline outputs, engine A's stats path)."""
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    model = str(make_model(root / "model", "small", seed=0, arch=arch, window=WINDOW))
    local = arch != "mistral-sw"
    args = ["--local-listen", str(root / "kvtier.sock")] if local else []
    s = Server.start(binary=kvtier_bin, args=args)
    try:
        url = f"unix://{root / 'kvtier.sock'}" if local else s.grpc
        res, _ = run_engine(spec(model, None, phases(arch, [P, H]), **ENGINE.get(arch, {})), root / "baseline")
        base = outputs(res)
        st = root / "store.jsonl"
        _, text = run_engine(spec(model, {"url": url, "stats_file": str(st)}, [{"prompts": [P]}],
                                  **ENGINE.get(arch, {})), root / "store")
        assert HMA_OFF not in text and "connector disabled" not in text, text[-4000:]
        yield arch, model, url, s, base, st
    finally:
        s.stop()


def test_a_hybrid_models_prefix_is_stored_per_group_and_loaded_by_a_fresh_engine(hybrid, tmp_path):
    arch, model, url, server, base, stored = hybrid
    inits = events(stored, "init")
    spaces = [e["namespace"] for e in inits]
    groups = {"mistral-sw": 1, "gemma3": 6, "granite-hybrid": 6}[arch]
    assert len(spaces) == len(set(spaces)) == groups, spaces
    with Client(server.grpc) as c:
        for e in inits:
            # Every attention group stores every block (a future prefix may
            # end anywhere); a state group the states vLLM keeps: by default
            # (prefix_cache_retention_interval 0) only the one at the
            # prompt's last block boundary, where a resend hits.
            keys = chain_keys(P, BS)[15:] if e["state"] else chain_keys(P, BS)
            assert wait_blocks(c, e["namespace"], keys) == len(keys), f"{e}: engine A's blocks never reached kvtier"
    if arch == "granite-hybrid":
        # One 39,296-byte state per Mamba2 layer and block (conv + SSM state).
        assert sorted(e["payload_bytes"] for e in inits if e["state"]) == [39296] * 5, inits

    st = tmp_path / "fresh.jsonl"
    fresh = {"prefix_caching": False} if arch not in FRESH else {}
    res, text = run_engine(
        spec(model, {"url": url, "stats_file": str(st)}, phases(arch, [P, H]), **fresh, **ENGINE.get(arch, {})),
        tmp_path / "fresh",
    )
    assert HMA_OFF not in text and "connector disabled" not in text, text[-4000:]
    out = outputs(res)
    # P: 16 blocks from kvtier, H: its first 8 (vLLM's own cache is off),
    # except where vLLM kept no Mamba state at H's boundary (nor would its own cache).
    assert out[0]["num_cached_tokens"] == 16 * BS, out[0]["num_cached_tokens"]
    want_h = 0 if arch == "granite-hybrid" else 8 * BS
    assert out[1]["num_cached_tokens"] == want_h, out[1]["num_cached_tokens"]
    assert_same_logprobs(out[0], base[0], f"{arch}: P loaded from kvtier")
    assert_same_logprobs(out[1], base[1], f"{arch}: H partly loaded from kvtier")

    loads = events(st, "load")
    assert all(not e["error"] and e["loaded"] == e["blocks"] for e in loads), loads
    # Per group and prompt: a sliding-window group loads its window only.
    want = {"mistral-sw": [window_blocks(16 * BS), window_blocks(8 * BS)],
            "gemma3": [16] + [window_blocks(16 * BS)] * 5 + [8] + [window_blocks(8 * BS)] * 5,
            "granite-hybrid": [16] + [1] * 5}[arch]
    assert sorted(e["blocks"] for e in loads) == sorted(want), loads
    # Window and state groups fail loads per request: vLLM takes that only from async loads.
    assert {e["mode"] for e in loads} == {"async"}, loads
    if arch != "mistral-sw":
        assert {e["transport"] for e in events(st, "transport")} == {"unix"}


def test_a_state_space_hybrid_without_prefix_caching_is_refused_by_name_and_keeps_hma(kvtier_bin, tmp_path):
    """With vLLM's prefix caching off, a Mamba hybrid keeps no state at block
    boundaries: nothing to store. Before hybrid support, vLLM turned HMA off
    for kvtier's connector and GraniteMoeHybrid died at start-up; now the
    connector names what it cannot cache and the engine serves."""
    model = str(make_model(tmp_path / "model", "small", seed=0, arch="granite-hybrid"))
    s = Server.start(binary=kvtier_bin)
    try:
        prompt = prompt_tokens(300, seed=5)
        res, text = run_engine(spec(model, {"url": s.grpc}, [{"prompts": [prompt]}], prefix_caching=False),
                               tmp_path / "engine")
    finally:
        s.stop()
    assert HMA_OFF not in text, text[-4000:]
    assert "kvtier connector disabled: KV-cache group 0 holds state-space" in text, text[-4000:]
    assert "mamba_cache_mode" in text and "prefix caching on" in text, text[-4000:]
    assert len(outputs(res)[0]["token_ids"]) == 4


def test_hybrid_test_models_have_the_layouts_they_are_named_for(tmp_path):
    import json

    m = Path(make_model(tmp_path / "g", "small", arch="gemma3", window=WINDOW))
    cfg = json.loads((m / "config.json").read_text())
    assert cfg["sliding_window"] == WINDOW
    assert cfg["layer_types"].count("sliding_attention") == 5 and cfg["layer_types"][5] == "full_attention"
