"""llm-d's KV-cache indexer (llm-d-kv-cache v0.9.0, run as tools/llmd-check)
fed by vLLM's own event publisher (``ZmqEventPublisher``, ``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``): the format kvtier publishes is
vLLM's (one block per event, kvtier's sha256-derived int64 hashes, media
CPU/DISK/STORAGE), so this pins down what llm-d makes of each event kvtier
will send, independently of kvtier's publisher.

Each test binds its publishers on loopback ephemeral ports, starts one
llmd-check connected to all of them, and waits for each subscription (ZMQ's
slow joiner: a SUB that connects after a PUB sends loses those messages)
before asserting anything. What llm-d holds is read with the tool's
``lookup``: per pod and tier, the leading run of the prompt's blocks.
"""
from __future__ import annotations

import itertools
import random
import time
from types import SimpleNamespace

import msgspec
import pytest
import zmq

from llmd import LlmdCheck, int64_hash, is_wide, wait_for

#: Tokens per block, on both sides (llm-d recomputes its keys from token_ids in blocks of this size).
BS = 16
MODEL = "some-model"
_markers = itertools.count()


class Chain:
    """``n`` blocks of BS tokens and their hashes (kvtier's: sha256-derived
    signed int64), or the given ``hashes`` (any type vLLM's event takes)."""

    def __init__(self, name: str, n: int, hashes: list | None = None):
        rng = random.Random(name)
        self.tokens = [rng.randrange(1, 100_000) for _ in range(n * BS)]
        self.hashes = hashes if hashes is not None else [int64_hash(MODEL, name, str(i)) for i in range(n)]
        # A hash msgpack writes narrower than 64 bits is rejected by llm-d
        # (test_only_64_bit_integer_or_bytes_hashes_are_accepted); a test that
        # means to index its chain must not trip on that by chance.
        if hashes is None:
            assert all(is_wide(h) for h in self.hashes)

    def block(self, i: int) -> list[int]:
        return self.tokens[i * BS:(i + 1) * BS]


def stored(chain: Chain, i: int, medium: str | None = "CPU", tokens: bool = True, parent: bool = True):
    """Block ``i``'s BlockStored as kvtier will send it: one block per event,
    parent = the previous block's hash; without tokens it is vLLM's own
    tier-only placeholder (offloading/events.py: token_ids=[], block_size=0,
    no parent)."""
    from vllm.distributed.kv_events import BlockStored

    return BlockStored(block_hashes=[chain.hashes[i]],
                       parent_block_hash=chain.hashes[i - 1] if i and parent and tokens else None,
                       token_ids=chain.block(i) if tokens else [], block_size=BS if tokens else 0,
                       lora_id=None, medium=medium, lora_name=None,
                       locality="LOCAL", ownership="kvtier:node")


def removed(chain: Chain, i: int, medium: str = "CPU"):
    from vllm.distributed.kv_events import BlockRemoved

    return BlockRemoved(block_hashes=[chain.hashes[i]], medium=medium, locality="LOCAL", ownership="kvtier:node")


class Node:
    """A publisher of topic ``kv@POD@MODEL``: vLLM's ZmqEventPublisher, or
    (raw) a plain PUB socket sending vLLM's encoding, so a test can alter the
    bytes the way kvtier's encoder differs from msgspec's."""

    def __init__(self, pod: str, model: str = MODEL, raw: bool = False):
        from vllm.distributed.kv_events import ZmqEventPublisher

        self.pod, self.model, self.topic = pod, model, f"kv@{pod}@{model}"
        self.raw = raw
        if raw:
            self.sock = zmq.Context.instance().socket(zmq.PUB)
            self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
            self.seq = itertools.count()
        else:
            # tcp://*:0 makes vLLM bind VLLM_HOST_IP (the fixture sets it to
            # 127.0.0.1) on a port the OS picks; anything else it would dial.
            self.pub = ZmqEventPublisher(0, endpoint="tcp://*:0", topic=self.topic)
            self.endpoint = self.pub.get_publisher_config().endpoint
            assert self.endpoint.startswith("tcp://127.0.0.1:"), self.endpoint

    def publish(self, *events, patch: tuple[bytes, bytes] | None = None) -> None:
        """One KVEventBatch of ``events``; ``patch`` (raw nodes) replaces bytes in the encoded payload."""
        from vllm.distributed.kv_events import KVEventBatch

        batch = KVEventBatch(ts=time.time(), events=list(events))
        if not self.raw:
            assert patch is None
            self.pub.publish(batch)
            return
        payload = msgspec.msgpack.encode(batch)
        if patch is not None:
            assert payload.count(patch[0]) == 1 and len(patch[0]) == len(patch[1])
            payload = payload.replace(*patch)
        self.sock.send_multipart([self.topic.encode(), next(self.seq).to_bytes(8, "big"), payload])

    def sync(self, llmd: LlmdCheck, timeout: float = 30.0) -> None:
        """Publishes a fresh one-block marker until llm-d shows it. llm-d
        processes one pod's events in order, so every batch this node sent
        before has then been processed too (a negative assertion needs this);
        the first sync also waits out the SUB's connection."""
        marker = Chain(f"marker-{self.topic}-{next(_markers)}", 1)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.publish(stored(marker, 0))
            poll_end = time.monotonic() + 0.3
            while time.monotonic() < poll_end:
                if self.pod in llmd.lookup(self.model, marker.tokens)["pods"]:
                    return
                time.sleep(0.02)
        pytest.fail(f"llm-d never saw {self.topic}'s marker; log tail:\n{llmd.log_tail()}")

    def close(self) -> None:
        if self.raw:
            self.sock.close(linger=0)
        else:
            self.pub.shutdown()


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    """``node(pod, model, raw)`` makes a publisher; ``start(*nodes, args=())``
    runs llmd-check subscribed to them, once each is seen to be connected."""
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")
    nodes: list[Node] = []
    tools: list[LlmdCheck] = []

    def node(pod: str, model: str = MODEL, raw: bool = False) -> Node:
        nodes.append(Node(pod, model, raw))
        return nodes[-1]

    def start(*of: Node, args: tuple[str, ...] = ()) -> LlmdCheck:
        tools.append(LlmdCheck([n.endpoint for n in of], BS, *args, log=tmp_path / f"llmd-check-{len(tools)}.log"))
        for n in of:
            n.sync(tools[-1])
        return tools[-1]

    yield SimpleNamespace(node=node, start=start)
    for t in tools:
        t.close()
    for n in nodes:
        n.close()


def until(llmd: LlmdCheck, chain: Chain, field: str, want, model: str = MODEL) -> dict:
    """Waits until lookup(chain)[field] == want; returns the whole lookup."""
    return wait_for(lambda: (r := llmd.lookup(model, chain.tokens))[field] == want and r,
                    describe=lambda: llmd.lookup(model, chain.tokens))


def test_a_chain_is_indexed_under_the_topics_pod_and_model(cluster):
    a = cluster.node("node-a")
    llmd = cluster.start(a)
    c = Chain("c", 4)
    a.publish(*(stored(c, i) for i in range(4)))
    r = until(llmd, c, "pods", {"node-a": {"cpu": 4}})  # "CPU" arrives lowercased
    assert r["keys"] == 4 and r["leading"] == {"node-a": 4} and r["held"] == {"node-a": {"cpu": [0, 1, 2, 3]}}
    # llm-d seeds its keys with the topic's model: the same tokens under
    # another model (for kvtier: another namespace) match nothing.
    assert llmd.lookup("other-model", c.tokens)["pods"] == {}
    # A longer prompt: its first 4 blocks hit; a partial last block has no key.
    longer = llmd.lookup(MODEL, c.tokens + list(range(1, BS + 4)))
    assert (longer["keys"], longer["pods"]) == (5, {"node-a": {"cpu": 4}})
    # llm-d's LongestPrefix scorer, default weights: cpu 0.8 per block.
    assert llmd.score(MODEL, c.tokens) == pytest.approx({"node-a": 3.2})


def test_removing_a_middle_block_cuts_the_leading_run_but_not_the_blocks_after_it(cluster):
    a = cluster.node("node-a")
    llmd = cluster.start(a)
    c = Chain("c", 4)
    a.publish(*(stored(c, i) for i in range(4)))
    until(llmd, c, "pods", {"node-a": {"cpu": 4}})

    a.publish(removed(c, 2))
    # The removed block's key leaves the index (its last holder went); the
    # index's Lookup skips a missing key and still reports block 3, but a
    # prefix match ends at block 2: leading run 2, and llm-d's scorer agrees.
    r = until(llmd, c, "pods", {"node-a": {"cpu": 2}})
    assert r["held"] == {"node-a": {"cpu": [0, 1, 3]}}
    assert llmd.score(MODEL, c.tokens) == pytest.approx({"node-a": 1.6})

    # Block 2's hash went with it (llm-d drops a hash's engine->request key
    # mapping when no pod holds the key in any tier): a tier-only update for
    # it is unresolvable, and a BlockStored naming it as parent is dropped.
    a.publish(stored(c, 2, "DISK", tokens=False), stored(c, 3, "DISK"))
    a.sync(llmd)
    assert llmd.lookup(MODEL, c.tokens)["held"] == {"node-a": {"cpu": [0, 1, 3]}}
    # Storing block 2 again with its tokens (its parent, block 1, is known) mends the run.
    a.publish(stored(c, 2))
    until(llmd, c, "pods", {"node-a": {"cpu": 4}})


def test_a_tier_only_update_adds_a_tier_to_a_block_llmd_already_knows(cluster):
    a = cluster.node("node-a")
    llmd = cluster.start(a)
    c = Chain("c", 4)
    a.publish(*(stored(c, i) for i in range(4)))
    until(llmd, c, "pods", {"node-a": {"cpu": 4}})
    # vLLM's placeholder form (no tokens, no parent): llm-d resolves the hash
    # through the mapping the tokenful BlockStored left, and adds the tier.
    a.publish(*(stored(c, i, "DISK", tokens=False) for i in range(4)))
    until(llmd, c, "pods", {"node-a": {"cpu": 4, "disk": 4}})
    # A hash it never saw with tokens: nothing to resolve, dropped.
    unknown = Chain("never-stored", 1)
    a.publish(stored(unknown, 0, "DISK", tokens=False))
    a.sync(llmd)
    assert llmd.lookup(MODEL, unknown.tokens)["pods"] == {}


def test_moving_a_block_to_disk_must_announce_the_disk_copy_before_dropping_the_memory_one(cluster):
    """A memory->disk move is two events. Removing the memory copy first
    leaves no holder, so llm-d forgets the hash, and a following tier-only
    BlockStored(DISK) cannot be resolved: the disk copy is lost to llm-d.
    Stored-then-removed, or a BlockStored(DISK) that carries its tokens and a
    parent llm-d still knows, both work."""
    a = cluster.node("node-a")
    llmd = cluster.start(a)
    c = Chain("c", 4)
    a.publish(*(stored(c, i) for i in range(4)))
    until(llmd, c, "pods", {"node-a": {"cpu": 4}})

    # Block 3: removed, then a tier-only store -> gone from every tier.
    a.publish(removed(c, 3), stored(c, 3, "DISK", tokens=False))
    a.sync(llmd)
    assert llmd.lookup(MODEL, c.tokens)["held"] == {"node-a": {"cpu": [0, 1, 2]}}
    # Block 2: tier-only store first, then the removal -> on disk.
    a.publish(stored(c, 2, "DISK", tokens=False), removed(c, 2))
    until(llmd, c, "held", {"node-a": {"cpu": [0, 1], "disk": [2]}})
    # Block 3 again, with tokens: its parent (block 2) is still held (on disk), so it resolves.
    a.publish(stored(c, 3, "DISK"))
    until(llmd, c, "held", {"node-a": {"cpu": [0, 1], "disk": [2, 3]}})
    # Block 1: removed, then stored with tokens: the parent (block 0) is known.
    a.publish(removed(c, 1), stored(c, 1, "DISK"))
    r = until(llmd, c, "held", {"node-a": {"cpu": [0], "disk": [1, 2, 3]}})
    # Per tier the leading runs are short; across tiers the pod holds all 4,
    # and llm-d's scorer counts across tiers too (block 0: cpu 0.8, then disk,
    # which has no default weight: 1.0 each).
    assert r["pods"] == {"node-a": {"cpu": 1, "disk": 0}} and r["leading"] == {"node-a": 4}
    assert llmd.score(MODEL, c.tokens) == pytest.approx({"node-a": 3.8})


def test_a_parent_announced_by_one_pod_resolves_a_block_from_another(cluster):
    """llm-d's hash -> key mapping is global, not per pod: a block whose
    parent only another pod announced is accepted (kvtier's hashes are the
    same on every node for the same block, so this is what lets node B
    announce a block it fetched from node A's chain)."""
    a, b = cluster.node("node-a"), cluster.node("node-b")
    llmd = cluster.start(a, b)
    c = Chain("c", 2)
    a.publish(stored(c, 0))
    until(llmd, c, "held", {"node-a": {"cpu": [0]}})
    b.publish(stored(c, 1))
    r = until(llmd, c, "held", {"node-a": {"cpu": [0]}, "node-b": {"cpu": [1]}})
    assert r["pods"] == {"node-a": {"cpu": 1}, "node-b": {"cpu": 0}}
    b.publish(stored(c, 0))
    until(llmd, c, "pods", {"node-a": {"cpu": 1}, "node-b": {"cpu": 2}})
    # A parent nobody announced: the block is dropped.
    orphan = Chain("orphan", 2)
    b.publish(stored(orphan, 1))
    b.sync(llmd)
    assert llmd.lookup(MODEL, orphan.tokens)["held"] == {}


def test_media_are_lowercased_and_weighted_by_the_scorer(cluster):
    a, b = cluster.node("node-a"), cluster.node("node-b")
    llmd = cluster.start(a, b)
    c, g, s = Chain("c", 4), Chain("g", 1), Chain("s", 1)
    a.publish(*(stored(c, i, "CPU") for i in range(4)))
    b.publish(*(stored(c, i, "DISK") for i in range(4)))
    until(llmd, c, "pods", {"node-a": {"cpu": 4}, "node-b": {"disk": 4}})
    b.publish(stored(s, 0, "Storage"))
    until(llmd, s, "pods", {"node-b": {"storage": 1}})
    b.publish(stored(g, 0, None))  # no medium: llm-d assumes GPU
    until(llmd, g, "pods", {"node-b": {"gpu": 1}})
    # llm-d's default weights know only gpu (1.0) and cpu (0.8); any other
    # tier weighs 1.0, so by default disk outranks memory.
    assert llmd.score(MODEL, c.tokens) == pytest.approx({"node-a": 3.2, "node-b": 4.0})
    assert llmd.score(MODEL, c.tokens, pods=["node-a"]) == pytest.approx({"node-a": 3.2})
    weighted = cluster.start(a, b, args=("--tier-weight", "disk=0.5"))
    a.publish(*(stored(c, i, "CPU") for i in range(4)))
    b.publish(*(stored(c, i, "DISK") for i in range(4)))
    until(weighted, c, "pods", {"node-a": {"cpu": 4}, "node-b": {"disk": 4}})
    assert weighted.score(MODEL, c.tokens) == pytest.approx({"node-a": 3.2, "node-b": 2.0})


def test_only_64_bit_integer_or_bytes_hashes_are_accepted(cluster):
    """llm-d v0.9.0 takes a hash that msgpack decodes as int64, uint64 or
    bytes (the last 8 bytes); msgspec (vLLM) writes an int in the fewest
    bytes, and llm-d rejects the narrower forms -- and with one bad event,
    the whole batch. kvtier writes every hash with the int64 marker (0xd3),
    which llm-d takes whatever the value."""
    a, k = cluster.node("node-a"), cluster.node("node-k", raw=True)
    llmd = cluster.start(a, k)
    good = Chain("good", 1)
    narrow = {"fixint": 7, "negative fixint": -5, "uint32": 2**31 + 5, "int32": -(2**31)}
    for name, h in narrow.items():
        assert not is_wide(h), name
        a.publish(stored(good, 0), stored(Chain(name, 1, hashes=[h]), 0))
    a.sync(llmd)
    assert llmd.lookup(MODEL, good.tokens)["pods"] == {}, "a batch with a narrow hash was (partly) indexed"
    for name in narrow:
        assert llmd.lookup(MODEL, Chain(name, 1).tokens)["pods"] == {}, name

    wide = {"uint64": 2**62 + 1, "int64": -(2**62), "bytes": int64_hash("x").to_bytes(8, "big", signed=True) * 4}
    for name, h in wide.items():
        a.publish(stored(Chain(name, 1, hashes=[h]), 0))
    for name in wide:
        until(llmd, Chain(name, 1), "pods", {"node-a": {"cpu": 1}})

    # kvtier's encoding: 7 with msgpack's int64 marker. msgspec cannot write
    # that, so a placeholder hash (a negative int64, which msgspec writes as
    # 0xd3 + 8 bytes) is swapped for it in the encoded payload.
    placeholder = -(2**62) - 12345
    marked = Chain("int64-marked 7", 1, hashes=[placeholder])
    k.publish(stored(marked, 0), patch=(b"\xd3" + placeholder.to_bytes(8, "big", signed=True),
                                        b"\xd3" + (7).to_bytes(8, "big", signed=True)))
    until(llmd, marked, "pods", {"node-k": {"cpu": 1}})


def test_all_blocks_cleared_on_a_nodes_wildcard_topic_clears_that_pod_in_every_tier(cluster):
    """kvtier sends AllBlocksCleared once at start, on topic kv@NODE@*: llm-d
    takes the pod from the topic and drops all its blocks, every model and tier."""
    from vllm.distributed.kv_events import AllBlocksCleared

    a, star, b = cluster.node("node-a"), cluster.node("node-a", model="*"), cluster.node("node-b")
    llmd = cluster.start(a, star, b)
    c = Chain("c", 4)
    a.publish(*(stored(c, i) for i in range(4)), *(stored(c, i, "DISK", tokens=False) for i in range(4)))
    b.publish(*(stored(c, i) for i in range(4)))
    until(llmd, c, "pods", {"node-a": {"cpu": 4, "disk": 4}, "node-b": {"cpu": 4}})
    star.publish(AllBlocksCleared())
    until(llmd, c, "pods", {"node-b": {"cpu": 4}})


def test_a_topic_with_more_than_two_ats_is_not_split(cluster):
    """llm-d splits the topic on "@" and needs exactly three parts; otherwise
    the whole topic is the pod and the model is "" (keys seeded with ""). A
    kvtier node or namespace containing "@" would be misattributed."""
    n = cluster.node("node-a", model="ns@v2")
    n.pod, n.model = "kv@node-a@ns@v2", ""  # what llm-d makes of it: sync() checks for exactly that
    llmd = cluster.start(n)
    c = Chain("c", 2)
    n.publish(stored(c, 0), stored(c, 1))
    until(llmd, c, "pods", {"kv@node-a@ns@v2": {"cpu": 2}}, model="")
    assert llmd.lookup("ns@v2", c.tokens)["pods"] == {}
