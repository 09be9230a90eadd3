"""The vLLM connector in real vLLM engines (CPU build) against a real kvtier.

One engine per process, as users run them; scenarios share engines where they
can, because each engine start costs tens of seconds on CI's two cores:

* ``store``: engine A stores a 2,100-token prompt P.
* ``baseline``: an engine without kvtier runs every prompt used below.
* ``fresh``: engine B, a new process, runs P (loaded from kvtier), P+X (a
  longer prompt: vLLM's own prefix cache), then, with vLLM's cache cleared,
  H (shares P's first 8 blocks: a partial kvtier hit) and P+X again (8 blocks
  local, the rest from kvtier).
* ``other_model``: a model of the same shape with other weights runs P on the
  same kvtier and must load nothing.
* ``failures``: kvtier down at engine start, back later, a corrupt block, and
  kvtier killed between Lookup and load.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from kvtier import Block, Client, KvtierError
from kvtier.server import Server
from kvtier.vllm.common import chain_keys
from kvtier.vllm.testing import prompt_tokens

from conftest import (
    HERE,
    Engine,
    assert_same_logprobs,
    events,
    free_port_pair,
    free_port_pairs,
    outputs,
    run_engine,
    wait_blocks,
)

BS = 128
P = prompt_tokens(2100, seed=1)          # 16 full blocks + 52 tokens
PX = P + prompt_tokens(300, seed=2)      # 18 full blocks; shares P's 16
H = P[:1024] + prompt_tokens(300, seed=3)  # 10 full blocks; shares P's first 8
Q = prompt_tokens(1500, seed=4)          # unrelated (OpenAI server test)


def spec(model: str, kv: dict | None, phases: list[dict], **kw) -> dict:
    return {"model": model, "kv": kv, "phases": phases, "max_model_len": 4096, **kw}


@pytest.fixture(scope="module")
def kvtier(kvtier_bin):
    s = Server.start(binary=kvtier_bin)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def baseline(models, tmp_path_factory):
    """Outputs of an engine without kvtier: P, PX, H, Q."""
    res, _ = run_engine(
        spec(models["m1"], None, [{"prompts": [P]}, {"prompts": [PX]}, {"prompts": [H]}, {"prompts": [Q]}]),
        tmp_path_factory.mktemp("baseline"),
    )
    out = outputs(res)
    return {"P": out[0], "PX": out[1], "H": out[2], "Q": out[3]}


@pytest.fixture(scope="module")
def stored(models, kvtier, tmp_path_factory):
    """Engine A stored P; returns (namespace, stats path)."""
    d = tmp_path_factory.mktemp("store")
    st = d / "stats.jsonl"
    run_engine(spec(models["m1"], {"url": kvtier.grpc, "stats_file": str(st)}, [{"prompts": [P]}]), d)
    ns = events(st, "init")[0]["namespace"]
    with Client(kvtier.grpc) as c:
        assert wait_blocks(c, ns, chain_keys(P, BS)) == 16, "engine A's 16 blocks never reached kvtier"
    return ns, st


@pytest.fixture(scope="module")
def fresh(models, kvtier, stored, tmp_path_factory):
    d = tmp_path_factory.mktemp("fresh")
    st = d / "stats.jsonl"
    res, log = run_engine(
        spec(models["m1"], {"url": kvtier.grpc, "stats_file": str(st)}, [
            {"prompts": [P]},
            {"prompts": [PX]},
            {"prompts": [H], "reset_prefix_cache": True},
            {"prompts": [PX]},
        ]),
        d,
    )
    loads = events(st, "load")
    return outputs(res), loads, st, log


def test_fresh_process_loads_the_stored_prefix(fresh, baseline, stored):
    out, loads, st, _ = fresh
    ns, _ = stored
    assert events(st, "init")[0]["namespace"] == ns, "same model and layout, same namespace"
    # P: 16 blocks from kvtier; vLLM computes only the last 52 tokens.
    assert loads[0]["blocks"] == 16 and loads[0]["loaded"] == 16 and not loads[0]["error"], loads[0]
    assert out[0]["num_cached_tokens"] == 16 * BS
    assert_same_logprobs(out[0], baseline["P"], "P loaded from kvtier")
    # P+X right after: vLLM's own prefix cache has P's blocks; nothing is loaded.
    assert out[1]["num_cached_tokens"] == 16 * BS
    assert_same_logprobs(out[1], baseline["PX"], "P+X after P")


@pytest.mark.parametrize("local", [False, True], ids=["tcp", "same-host"])
def test_a_step_larger_than_the_servers_request_limit_is_stored_whole(models, kvtier_bin, baseline,
                                                                      tmp_path_factory, local):
    """One prefill step saves P's 16 blocks (8 MiB) at once, four times the
    server's 2 MiB request limit: the client splits the write to fit, so every
    block is stored and a fresh engine loads them all. Before, the write was
    refused mid-send, reported as an outage, and nothing was cached (as with
    an 8B model's 512 MiB steps against the default 256 MiB limit)."""
    d = tmp_path_factory.mktemp(f"big-step-{'local' if local else 'tcp'}")
    cfg = d / "kvtier.toml"
    cfg.write_text('[server]\nmax_message_size = "2MiB"\n[engine]\nmax_block_size = "1MiB"\n')
    args = ["--config", str(cfg)] + (["--local-listen", str(d / "kvtier.sock")] if local else [])
    s = Server.start(binary=kvtier_bin, args=args)
    try:
        url = f"unix://{d / 'kvtier.sock'}" if local else s.grpc
        st = d / "stats.jsonl"
        run_engine(spec(models["m1"], {"url": url, "stats_file": str(st)}, [{"prompts": [P]}]), d / "a")
        ns = events(st, "init")[0]["namespace"]
        with Client(s.grpc) as c:
            assert wait_blocks(c, ns, chain_keys(P, BS)) == 16, "the 8 MiB step was not stored whole"
        st2 = d / "stats2.jsonl"
        res, text = run_engine(spec(models["m1"], {"url": url, "stats_file": str(st2)}, [{"prompts": [P]}]), d / "b")
        load = events(st2, "load")[0]
        assert load["loaded"] == 16 and not load["error"], load
        # On the same-host socket the blocks land in vLLM's cache itself, a
        # region per layer (load_in_place: auto); over TCP they are staged.
        assert load["in_place"] == (16 if local else 0), load
        # The engine's log says which way the blocks moved, once per worker.
        said = [e["transport"] for e in events(st2, "transport")]
        assert said == ["unix" if local else "tcp"], said
        way = "kvtier's same-host socket" if local else "kvtier's TCP data plane"
        assert text.count("blocks move over") == 1 and way in text, text[-3000:]
        assert_same_logprobs(outputs(res)[0], baseline["P"], "P loaded after a split save")
    finally:
        s.stop()


def test_partial_hits_combine_with_vllms_prefix_cache(fresh, baseline):
    out, loads, _, _ = fresh
    # Only P, then H and P+X loaded anything (P+X in phase 2 was a local hit).
    assert [x["blocks"] for x in loads] == [16, 8, 10], loads
    # H: kvtier holds P's first 8 blocks, which H shares; its own 2 differ.
    assert loads[1]["loaded"] == 8 and out[2]["num_cached_tokens"] == 8 * BS
    assert_same_logprobs(out[2], baseline["H"], "H, a partial kvtier hit")
    # P+X: 8 blocks in vLLM's cache (from H), blocks 8..17 from kvtier (16 from A,
    # 2 stored by this engine in phase 2): only the 10 beyond the local hit load.
    assert loads[2]["loaded"] == 10 and out[3]["num_cached_tokens"] == 18 * BS
    assert_same_logprobs(out[3], baseline["PX"], "P+X, local and kvtier hits combined")


def test_another_model_never_loads_this_models_kv(models, kvtier, stored, baseline, tmp_path_factory):
    d = tmp_path_factory.mktemp("other")
    st = d / "stats.jsonl"
    res, _ = run_engine(spec(models["m2"], {"url": kvtier.grpc, "stats_file": str(st)}, [{"prompts": [P]}]), d)
    ns, _ = stored
    assert events(st, "init")[0]["namespace"] != ns
    assert [e["found"] for e in events(st, "lookup")] == [0]
    assert events(st, "load") == []
    assert outputs(res)[0]["num_cached_tokens"] == 0


def test_failures_are_recomputed_and_the_engine_keeps_serving(models, kvtier_bin, baseline, tmp_path_factory):
    """kvtier down at start -> serves; kvtier back -> used again; a corrupt block
    -> recomputed and healed; kvtier killed between Lookup and load -> recomputed."""
    d = tmp_path_factory.mktemp("failures")
    st = d / "stats.jsonl"
    port = free_port_pair()
    url = f"127.0.0.1:{port}"
    kill_file = d / "kill.pid"
    go = [d / f"go{i}" for i in range(6)]
    done = [d / f"done{i}" for i in range(6)]
    engine = Engine(
        spec(models["m1"], {"url": url, "stats_file": str(st), "retry_initial_ms": 200, "retry_max_ms": 400},
             [
                 {"prompts": [P], "done": str(done[1])},
                 {"prompts": [P], "wait_for": str(go[2]), "reset_prefix_cache": True, "until": str(d / "stored"),
                  "done": str(done[2])},
                 {"prompts": [P], "wait_for": str(go[3]), "reset_prefix_cache": True, "done": str(done[3])},
                 {"prompts": [PX], "wait_for": str(go[4]), "reset_prefix_cache": True, "done": str(done[4])},
                 {"prompts": [H], "reset_prefix_cache": True, "done": str(done[5])},
             ],
             connector_class="KillingConnector", connector_module="killing_connector", sys_path=[str(HERE)]),
        d,
        env={"KVTIER_TEST_KILL_FILE": str(kill_file)},
    )
    server = None
    try:
        # 1. Nothing listens at the url: the engine starts and serves, without kvtier.
        out1 = engine.wait_file(done[1])["outputs"][0]
        assert_same_logprobs(out1, baseline["P"], "served with kvtier down")
        assert events(st, "load") == []
        warnings = [line for line in engine.text().splitlines() if "is unreachable" in line]
        assert 1 <= len(warnings) <= 2, f"one warning per process role, got {warnings}"

        # 2. kvtier comes up at that address: the engine uses it again (it runs P
        # over and over until kvtier holds P's blocks; gRPC's reconnect back-off
        # and the connector's retry pause bound how long that takes).
        server = Server.start(binary=kvtier_bin, listen=url)
        up, up_wall = time.monotonic(), time.time()
        go[2].touch()
        ns = events(st, "init")[0]["namespace"]
        keys = chain_keys(P, BS)
        with Client(url) as c:
            assert wait_blocks(c, ns, keys, timeout=60) == 16, "blocks never stored after kvtier came back"
            # The scheduler's own channels reconnect on gRPC's back-off (at
            # most 2 s), independently of the worker's: wait until its lookups
            # succeed again too, as a user's next request would.
            end = time.monotonic() + 60
            while not [e for e in events(st, "lookup") if not e.get("error") and e["t"] > up_wall]:
                assert time.monotonic() < end, "the scheduler never looked up again after kvtier came back"
                time.sleep(0.05)
            recovered = time.monotonic() - up
            assert recovered < 30, f"the engine took {recovered:.1f} s to use kvtier again"
            (d / "stored").touch()
            out2 = engine.wait_file(done[2])["outputs"][0]
            assert_same_logprobs(out2, baseline["P"], "after kvtier came back")
            payload_bytes = events(st, "init")[0]["payload_bytes"]
            # 3. Block 5 replaced by one of the wrong size (another writer's garbage).
            # The engine's saves are asynchronous: one still in flight after
            # done[2] can store the right block 5 again between our delete and
            # our write. Repeat until ours is the one held.
            end = time.monotonic() + 30
            while True:
                c.delete(ns, [keys[5]])
                try:
                    c.write(ns, [Block(key=keys[5], parent=keys[4], payload=b"\x01" * 1000, token_count=BS)])
                    break
                except KvtierError as e:
                    assert "already holds a different block" in str(e), e
                    assert time.monotonic() < end, "an engine save kept replacing block 5"
            assert c.lookup(ns, keys=keys).found == 6
        go[3].touch()
        out3 = engine.wait_file(done[3])["outputs"][0]
        assert_same_logprobs(out3, baseline["P"], "with a corrupt block")
        load3 = events(st, "load")[-1]
        assert load3["loaded"] == 5 and "expected" in load3["error"], load3
        with Client(url) as c:
            # Healed: the bad block was deleted and the recomputed ones stored.
            assert wait_blocks(c, ns, keys) == 16
            assert len(c.read(ns, [keys[5]]).blocks[0].payload) == payload_bytes

        # 4. kvtier is SIGKILLed after the Lookup found P+X's prefix, before the load.
        kill_file.write_text(str(server.pid))
        go[4].touch()
        out4 = engine.wait_file(done[4])["outputs"][0]
        assert Path(str(kill_file) + ".killed").exists(), "the kill hook never ran"
        assert_same_logprobs(out4, baseline["PX"], "kvtier killed between lookup and load")
        load4 = events(st, "load")[-1]
        assert load4["loaded"] == 0 and load4["blocks"] >= 16 and load4["error"], load4

        # 5. And it keeps serving with kvtier gone.
        out5 = engine.wait_file(done[5])["outputs"][0]
        assert_same_logprobs(out5, baseline["H"], "after kvtier died")
        engine.wait()
    finally:
        engine.kill()
        if server is not None and server.running:
            server.stop()
        elif server is not None:
            server.stop()  # reaps the killed process


def test_a_cluster_serves_engines_through_the_node_list_or_one_address(models, kvtier_bin, baseline,
                                                                        tmp_path_factory):
    """Three kvtier nodes as one cache (docs/cluster.md, no object store: R=2
    copies). Engine A saves P through the node list (``url: "a,b,c"``: the
    connector places each block on its owners); engine B, a new process,
    knows only one node and loads all 16 blocks through it, with the same
    logprobs as an engine without kvtier."""
    ports = free_port_pairs(3)
    nodes = [f"127.0.0.1:{p}" for p in ports]
    members = ",".join(f"grpc://{n}" for n in nodes)
    servers = [Server.start(binary=kvtier_bin, listen=n,
                            args=["--cluster-nodes", members, "--cluster-self", f"grpc://{n}"]) for n in nodes]
    try:
        d = tmp_path_factory.mktemp("cluster-store")
        st = d / "stats.jsonl"
        run_engine(spec(models["m1"], {"url": ",".join(nodes), "stats_file": str(st)}, [{"prompts": [P]}]), d)
        ns = events(st, "init")[0]["namespace"]
        keys = chain_keys(P, BS)
        with Client(nodes[1]) as c:
            assert wait_blocks(c, ns, keys) == 16, "engine A's blocks never reached the cluster"
        # Each block is on its two owners only: the node list placed them.
        from kvtier.keys import owners

        want = [sum(n in owners(nodes, ns, k, 2) for k in keys) for n in nodes]
        held = []
        for n in nodes:
            with Client(n) as c:
                held.append(sum(t.blocks for t in c.stats().tiers))
        assert held == want and sum(held) == 32, (held, want)
        d = tmp_path_factory.mktemp("cluster-load")
        st = d / "stats.jsonl"
        res, _ = run_engine(spec(models["m1"], {"url": nodes[2], "stats_file": str(st)}, [{"prompts": [P]}]), d)
        loads = events(st, "load")
        assert loads[0]["blocks"] == 16 and loads[0]["loaded"] == 16 and not loads[0]["error"], loads
        out = outputs(res)
        assert out[0]["num_cached_tokens"] == 16 * BS
        assert_same_logprobs(out[0], baseline["P"], "P loaded through one node of a cluster")
    finally:
        for s in servers:
            s.stop()


def test_openai_server_second_completion_is_served_from_kvtier(models, kvtier, tmp_path_factory):
    """``python -m vllm.entrypoints.openai.api_server ... --kv-transfer-config``, two
    identical completions: the second loads the prompt's blocks from kvtier."""
    import subprocess
    import sys
    import time
    import urllib.request

    d = tmp_path_factory.mktemp("openai")
    st = d / "stats.jsonl"
    port = free_port_pair()
    kv = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
          "kv_connector_extra_config": {"url": kvtier.grpc, "stats_file": str(st)}}
    log = open(d / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", models["m1"],
         "--host", "127.0.0.1", "--port", str(port), "--block-size", "128", "--dtype", "float32",
         "--max-model-len", "4096", "--enforce-eager", "--gpu-memory-utilization", "0.3",
         "--no-enable-prefix-caching", "--kv-transfer-config", json.dumps(kv)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 600
        while True:
            assert proc.poll() is None, (d / "server.log").read_text()[-6000:]
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < end, "api_server not healthy within 600 s"
            time.sleep(0.2)

        def complete():
            body = json.dumps({"model": models["m1"], "prompt": Q, "max_tokens": 4, "temperature": 0,
                               "logprobs": 5}).encode()
            req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
            return json.loads(urllib.request.urlopen(req, timeout=300).read())["choices"][0]

        first = complete()
        ns = events(st, "init")[0]["namespace"]
        with Client(kvtier.grpc) as c:
            assert wait_blocks(c, ns, chain_keys(Q, BS)) == len(Q) // BS
        second = complete()
        loads = events(st, "load")
        assert len(loads) == 1 and loads[0]["loaded"] == len(Q) // BS, loads
        assert first["text"] == second["text"]
        for a, b in zip(first["logprobs"]["top_logprobs"], second["logprobs"]["top_logprobs"]):
            for tok in set(a) & set(b):
                assert abs(a[tok] - b[tok]) <= 1e-4
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
