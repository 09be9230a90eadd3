"""The cache-aware router's index and score (perf/serving/router_index.py,
router_score.py; docs/serving.md, "Cache-aware routing") fed synthetic KV
events in the decoded form vLLM and kvtier publish: the replica holding
more of the prompt wins, the tiers weigh as documented, a chain spread
over two kvtier nodes is followed whichever node announces a block first,
and load breaks a tie and outweighs a small overlap but not a large one.
"""
from __future__ import annotations

import sys

import pytest

from kvtier.server import REPO_ROOT

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from perf.serving.router_events import kvtier_hash, kvtier_keys
from perf.serving.router_index import PrefixIndex, chain
from perf.serving.router_score import DEFAULT_WEIGHTS, Load, Scorer, parse_weights

PROMPT = list(range(100, 141))  # 41 tokens: 10 engine blocks of 4, 5 kvtier blocks of 8
E = ["engine:a", "engine:b"]


def stored(hashes, parent, tokens, bs, medium="GPU", **kw):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": bs, "medium": medium, "lora_id": None, "lora_name": None, **kw}


def removed(hashes, medium="GPU"):
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def engine_holds(index, name, blocks, bs=4, tag=b"", tokens=PROMPT):
    """``name``'s engine stores the first ``blocks`` blocks of ``tokens`` in one event (vLLM's form:
    several hashes, their tokens end to end), hashes of its own (bytes, as vLLM's sha256)."""
    src = index.source(name, "engine", name)
    hashes = [tag + name.encode() + bytes([i]) for i in range(blocks)]
    index.apply(src, [stored(hashes, None, tokens[:blocks * bs], bs, group_idx=0)])
    return hashes


def kv_hash(i):
    return -(1 << 62) + i  # kvtier's hashes are signed 64-bit ints


def kvtier_block(index, node, i, medium="CPU", bs=8, ns="vllm/m/0", tokens=PROMPT, with_tokens=True):
    src = index.source(node, "kvtier", "kvtier")
    parent = kv_hash(i - 1) if i else None
    toks = tokens[i * bs:(i + 1) * bs] if with_tokens else []
    index.apply(src, [stored([kv_hash(i)], parent, toks, bs if with_tokens else 0, medium, locality="LOCAL",
                             ownership=f"kvtier:{node}")], scope=ns)


def test_the_replica_holding_more_of_the_prompt_wins_and_a_removed_block_ends_the_run():
    index = PrefixIndex()
    engine_holds(index, E[0], 2)
    hb = engine_holds(index, E[1], 6)
    s = Scorer(index, E)
    pick, scores = s.choose(PROMPT, Load.empty(2))
    assert pick == 1
    assert [x.engine_tokens for x in scores] == [8, 24]
    assert scores[1].credit == 24 and scores[1].tiers == {"engine": 24}
    # vLLM evicts block 3 of b's: its run is 3 blocks, a's 2
    index.apply(index.sources[E[1]], [removed([hb[3]])])
    assert [x.engine_tokens for x in s.scores(PROMPT, Load.empty(2))] == [8, 12]
    index.apply(index.sources[E[1]], [{"type": "AllBlocksCleared"}])
    assert s.choose(PROMPT, Load.empty(2))[0] == 0


def test_a_chain_grown_over_several_events_is_followed_through_the_parent_hash():
    index = PrefixIndex()
    src = index.source(E[0], "engine", E[0])
    index.apply(src, [stored([b"h0", b"h1"], None, PROMPT[:8], 4)])
    index.apply(src, [stored([b"h2"], b"h1", PROMPT[8:12], 4)])
    # another prompt sharing block 0 only: a branch of the same tree
    other = PROMPT[:4] + [7, 7, 7, 7]
    index.apply(src, [stored([b"x1"], b"h0", other[4:8], 4)])
    assert src.run(PROMPT)[1] and len(src.run(PROMPT)[1]) == 3
    assert len(src.run(other)[1]) == 2
    assert src.run(PROMPT[:4] + [9] * 8)[1] == [{"GPU"}]
    # the last token is always computed: a prompt of exactly the cached 12 tokens is credited 11
    sc = Scorer(index, [E[0]]).scores(PROMPT[:12], Load.empty(1))[0]
    assert sc.engine_tokens == 11


def test_equal_scores_go_round_robin_and_load_breaks_a_tie():
    index = PrefixIndex()
    s = Scorer(index, E)
    assert [s.choose(PROMPT, Load.empty(2))[0] for _ in range(4)] == [0, 1, 0, 1]
    engine_holds(index, E[0], 5)
    engine_holds(index, E[1], 5)
    busy = Load([1, 0], [0.0, 0.0], [50.0, 0.0])  # a request of 50 tokens decoding on a
    assert [s.choose(PROMPT, busy)[0] for _ in range(3)] == [1, 1, 1]
    assert [s.choose(PROMPT, Load([0, 0], [0.0, 30.0], [0.0, 30.0]))[0] for _ in range(2)] == [0, 0]
    flat = Scorer(index, E, weights={"active_token": 0, "inflight_request": 8})
    assert flat.choose(PROMPT, Load([2, 1], [0.0, 0.0], [0.0, 0.0]))[0] == 1, "fewer requests in flight"


def test_load_outweighs_a_small_overlap_but_not_a_large_one():
    index = PrefixIndex()
    engine_holds(index, E[0], 1)  # 4 tokens: a short shared system prompt, say
    s = Scorer(index, E)
    assert s.choose(PROMPT, Load.empty(2))[0] == 0, "idle, the overlap decides"
    one_running = Load([1, 0], [0.0, 0.0], [32.0, 0.0])  # one request of 32 tokens decoding on a
    assert s.choose(PROMPT, one_running)[0] == 1
    assert s.choose(PROMPT, Load([1, 0], [20.0, 0.0], [0.0, 0.0]))[0] == 1, "a queued prefill of 20 tokens > 4 saved"
    engine_holds(index, E[0], 10, tag=b"long")  # now 40 tokens of a's cache cover the prompt
    pick, scores = s.choose(PROMPT, one_running)
    assert pick == 0, "40 tokens saved outweigh one small decoding request"
    assert scores[0].score == 40 - 32 * DEFAULT_WEIGHTS["active_token"]
    assert s.choose(PROMPT, Load([1, 0], [30.0, 0.0], [32.0, 0.0]))[0] == 1, "a queued prefill on top outweighs them"


def test_kvtier_blocks_spread_over_two_nodes_credit_the_replica_on_the_node_holding_most():
    index = PrefixIndex()
    # blocks 0, 1, 2 on node A, 3 on node B; B announces block 3 before A
    # announces its parent (the feeds are separate sockets): it waits, then joins
    kvtier_block(index, "B:1", 3)
    for i in range(3):
        kvtier_block(index, "A:1", i)
    assert index.domains["kvtier"].waiting == 0
    s = Scorer(index, E, nodes=["A:1", "B:1"])
    pick, scores = s.choose(PROMPT, Load.empty(2))
    w = DEFAULT_WEIGHTS
    assert pick == 0
    assert [x.kvtier_tokens for x in scores] == [32, 32]
    assert scores[0].tiers == {"kvtier_memory_local": 24, "kvtier_memory_remote": 8}
    assert scores[0].credit == pytest.approx(24 * w["kvtier_memory_local"] + 8 * w["kvtier_memory_remote"])
    assert scores[1].credit == pytest.approx(24 * w["kvtier_memory_remote"] + 8 * w["kvtier_memory_local"])
    # A demotes blocks 0-2 to disk (BlockRemoved CPU + BlockStored DISK without tokens):
    # a's local credit falls to the disk weight
    for i in range(3):
        index.apply(index.sources["A:1"], [removed([kv_hash(i)], "CPU")], scope="vllm/m/0")
        kvtier_block(index, "A:1", i, medium="DISK", with_tokens=False)
    sc = s.scores(PROMPT, Load.empty(2))
    assert sc[0].tiers == {"kvtier_disk_local": 24, "kvtier_memory_remote": 8}
    assert sc[1].tiers == {"kvtier_disk_remote": 24, "kvtier_memory_local": 8}
    # without kvtier's events (use_kvtier=False) the two are equal: round-robin
    assert Scorer(index, E, use_kvtier=False).scores(PROMPT, Load.empty(2))[0].credit == 0


def test_engine_cache_comes_first_and_kvtier_covers_the_rest_at_its_own_block_size():
    index = PrefixIndex()
    engine_holds(index, E[1], 3)  # b's engine: 12 tokens in blocks of 4
    for i in range(4):  # kvtier: 32 tokens in blocks of 8, on a's node
        kvtier_block(index, "A:1", i)
    s = Scorer(index, E, nodes=["A:1", "B:1"])
    sc = s.scores(PROMPT, Load.empty(2))
    w = DEFAULT_WEIGHTS
    assert sc[0].tiers == {"kvtier_memory_local": 32}
    # b: its own 12 tokens, then kvtier from token 12 (half of block 1) to 32, from the other node
    assert sc[1].tiers == {"engine": 12, "kvtier_memory_remote": 20}
    assert sc[1].credit == pytest.approx(12 + 20 * w["kvtier_memory_remote"])
    assert s.choose(PROMPT, Load.empty(2))[0] == 0  # 28.8 > 24
    # an object-store copy of block 4 extends the run for both
    kvtier_block(index, "B:1", 4, medium="STORAGE")
    sc = s.scores(PROMPT, Load.empty(2))
    assert sc[0].tiers["kvtier_storage"] == 8 and sc[1].tiers["kvtier_storage"] == 8


def test_the_index_hash_is_the_tokens_chain_and_namespaces_do_not_mix():
    assert chain(PROMPT, 8) == chain(PROMPT[:40], 8) and len(chain(PROMPT, 8)) == 5
    assert chain(PROMPT, 4)[1] != chain(PROMPT, 8)[0], "block boundaries are part of the chain"
    index = PrefixIndex()
    kvtier_block(index, "A:1", 0, ns="vllm/m/0")
    # a block of another namespace names the same parent hash: it is not this chain's child
    kvtier_block(index, "A:1", 1, ns="vllm/other/0")
    assert len(index.sources["A:1"].run(PROMPT)[1]) == 1
    assert index.domains["kvtier"].waiting == 1
    # a block announced without tokens is no token chain's
    kvtier_block(index, "A:1", 7, with_tokens=False)
    assert index.counts["untokened"] == 1 and len(index.sources["A:1"].run(PROMPT)[1]) == 1


def test_blocks_kvtier_announced_without_tokens_are_found_by_kvtiers_own_keys():
    """A writer that sends no token ids: kvtier announces ``token_ids=[]``
    and the block's hash, ``sha256(namespace ‖ 0 ‖ key)``; the router computes
    the connector's keys (docs/keys.md) for the prompt and finds them."""
    from kvtier.keys import chain as kvtier_chain

    ns = "vllm/small/0123"
    keys = kvtier_chain(PROMPT, 8)
    index = PrefixIndex()
    for i, k in enumerate(keys[:4]):
        src = index.source("A:1" if i != 2 else "B:1", "kvtier", "kvtier")
        parent = kvtier_hash(ns, keys[i - 1]) if i else None
        index.apply(src, [stored([kvtier_hash(ns, k)], parent, [], 0, "CPU")], scope=ns)
    assert index.counts["untokened"] == 4
    plain = Scorer(index, E, nodes=["A:1", "B:1"])
    assert plain.scores(PROMPT, Load.empty(2))[0].kvtier_tokens == 0, "no tokens, no chain"
    keyed = Scorer(index, E, nodes=["A:1", "B:1"], kvtier_keys=kvtier_keys(lambda: [ns], lambda: 8))
    pick, sc = keyed.choose(PROMPT, Load.empty(2))
    assert pick == 0 and sc[0].kvtier_tokens == 32
    assert sc[0].tiers == {"kvtier_memory_local": 24, "kvtier_memory_remote": 8}
    # another namespace's keys are other hashes
    other = Scorer(index, E, kvtier_keys=kvtier_keys(lambda: ["vllm/other/1"], lambda: 8))
    assert other.scores(PROMPT, Load.empty(2))[0].kvtier_tokens == 0
    # the same block removed from memory ends the run there
    index.apply(index.sources["B:1"], [removed([kvtier_hash(ns, keys[2])], "CPU")], scope=ns)
    assert keyed.scores(PROMPT, Load.empty(2))[0].kvtier_tokens == 16


def test_weights_are_overridden_by_name():
    w = parse_weights(["inflight_request=0", "kvtier_storage=0.1"])
    assert w["inflight_request"] == 0 and w["kvtier_storage"] == 0.1 and w["engine"] == 1.0
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_weights(["nope=1"])
