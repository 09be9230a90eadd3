"""The serving benchmark's peer connectors (``perf/serving/peers.py``) on
vLLM's CPU build: each either sets up (its service started, a config vLLM
accepts) or says why it cannot run here; vLLM's ExampleConnector, run in a
real OpenAI server, loads a prompt's KV back once the local prefix cache is
gone, with recomputation's logprobs.
"""
from __future__ import annotations

import json
import random
import sys
import urllib.request
from pathlib import Path

import pytest

from kvtier.server import REPO_ROOT

from conftest import TOL

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from perf.serving.engines import Replica, ReplicaSpec
from perf.serving.peers import PEERS, PeerUnavailable, peer_setup, replica_config


@pytest.mark.parametrize("name", sorted(PEERS))
def test_a_peer_sets_up_with_a_config_vllm_accepts_or_says_why_not(name, tmp_path):
    from vllm.config import KVTransferConfig

    peer = PEERS[name]
    if peer.unavailable is not None:
        with pytest.raises(PeerUnavailable) as e:
            with peer_setup(name, tmp_path):
                pass
        assert e.value.error.strip() and e.value.source.strip(), e.value
        assert e.value.error in str(e.value) and e.value.source in str(e.value)
        return
    with peer_setup(name, tmp_path) as (cfg, env, extra_path):
        parsed = KVTransferConfig(**cfg)
        assert parsed.kv_connector == peer.connector
        assert parsed.is_kv_transfer_instance
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()), env
        for p in extra_path:
            assert Path(p).is_dir(), p
        # Replicas of one deployment differ only where the connector needs it.
        r0, r1 = replica_config(cfg, 0), replica_config(cfg, 1)
        KVTransferConfig(**r1)
        if peer.connector == "MooncakeStoreConnector":
            assert r0["kv_connector_extra_config"]["lookup_rpc_port"] != \
                r1["kv_connector_extra_config"]["lookup_rpc_port"]
        else:
            assert r0 == r1 == cfg


def test_an_unknown_peer_is_named_in_the_error(tmp_path):
    with pytest.raises(KeyError, match="no-such-peer"):
        peer_setup("no-such-peer", tmp_path)


def _post(url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else b"", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        data = r.read()
    return json.loads(data) if data else {}


def test_example_connector_loads_a_prompt_back_after_the_prefix_cache_is_reset(tmp_path):
    """The same prompt twice with vLLM's own prefix cache reset between
    (``/reset_prefix_cache``, VLLM_SERVER_DEV_MODE): the second run's full
    blocks come from the connector (``vllm:external_prefix_cache_hits_total``)
    and its logprobs equal the first run's."""
    from kvtier.vllm.testing import make_model

    model = str(make_model(tmp_path / "model", "small", seed=0))
    with peer_setup("example", tmp_path / "peer") as (cfg, env, extra_path):
        spec = ReplicaSpec(model=model, kv_transfer_config=cfg, env={"VLLM_SERVER_DEV_MODE": "1", **env})
        r = Replica.spawn(spec, tmp_path / "engine.log", extra_path=extra_path)
        try:
            r.ready(300)
            rng = random.Random(1)
            prompt = " ".join(rng.choice(["alpha", "river", "stone", "cloud", "paper", "green"]) for _ in range(300))
            body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "logprobs": 1}
            first = _post(r.url + "/v1/completions", body)
            before = r.metrics()
            assert before["external_hits"] == 0, before
            _post(r.url + "/reset_prefix_cache")
            second = _post(r.url + "/v1/completions", body)
            after = r.metrics()
        finally:
            r.stop()
    n = first["usage"]["prompt_tokens"]
    # ExampleConnector loads align(n - 1) tokens: the prompt's whole blocks but the last token's.
    loaded = (n - 2) // spec.block_size * spec.block_size
    assert loaded >= 4 * spec.block_size, n
    assert after["local_hits"] == before["local_hits"], "the reset left vLLM's own prefix cache in place"
    assert after["external_hits"] - before["external_hits"] == loaded, (before, after)
    a = first["choices"][0]["logprobs"]["token_logprobs"]
    b = second["choices"][0]["logprobs"]["token_logprobs"]
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)
    assert list((tmp_path / "peer" / "example-store").iterdir()), "nothing was stored"
