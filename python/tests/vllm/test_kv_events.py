"""kvtier's KV events decoded with vLLM's own types (``vllm.distributed.
kv_events``: ``KVEventBatch``, ``BlockStored``, ``BlockRemoved``,
``AllBlocksCleared``) from a real ``kvtier serve --kv-events``: what a block's
life in memory, on disk and in the object store looks like on the wire, the
replay endpoint, and what the events must never carry (docs/events.md,
docs/security.md "KV events").
"""
from __future__ import annotations

import subprocess

import grpc
import msgspec
import pytest
from kvevents import BS, Chain, Node, Sub, joined, replay

from kvtier import Block, KvtierError, _proto
from kvtier.server import ServerError


def stored(sub: Sub, ns: str, medium: str) -> list:
    return [e for e in sub.events(ns) if type(e).__name__ == "BlockStored" and e.medium == medium]


def removed(sub: Sub, ns: str, medium: str) -> list:
    return [e for e in sub.events(ns) if type(e).__name__ == "BlockRemoved" and e.medium == medium]


def test_a_chain_is_announced_per_tier_with_its_tokens_and_removed_on_delete(tmp_path):
    node = Node(tmp_path, "node-a", "--disk-dir", str(tmp_path / "disk"),
                "--object-store", f"file://{tmp_path / 'objects'}")
    sub = Sub(node.endpoint)
    try:
        joined(node, sub)
        c = Chain("acme/llama", "c", 3)
        c.write(node)
        sub.wait(lambda s: len(stored(s, c.ns, "STORAGE")) == 3 and len(stored(s, c.ns, "DISK")) == 3
                 and len(stored(s, c.ns, "CPU")) == 3)
        for medium, locality in (("CPU", "LOCAL"), ("DISK", "LOCAL"), ("STORAGE", "REMOTE")):
            got = sorted(stored(sub, c.ns, medium), key=lambda e: c.keys.index(
                next(k for k in c.keys if c.hash(c.keys.index(k)) == e.block_hashes[0])))
            for i, e in enumerate(got):
                assert e.block_hashes == [c.hash(i)], (medium, i)
                assert e.parent_block_hash == (c.hash(i - 1) if i else None)
                assert e.token_ids == c.tokens[i * BS:(i + 1) * BS]
                assert e.block_size == BS
                assert (e.locality, e.ownership) == (locality, "kvtier:node-a")
        topics = {t for t, _, _ in sub.batches}
        assert f"kv@node-a@{c.ns}" in topics
        seqs = [s for _, s, _ in sub.batches]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)

        # Deleting the head removes the chain from every tier that held it.
        node.client.delete(c.ns, [c.keys[0]])
        sub.wait(lambda s: len(removed(s, c.ns, "CPU")) == 3 and len(removed(s, c.ns, "DISK")) == 3)
        assert {e.block_hashes[0] for e in removed(sub, c.ns, "CPU")} == {c.hash(i) for i in range(3)}
    finally:
        sub.close()
        node.stop()


def test_eviction_demotes_with_tokens_and_a_restart_clears_then_reannounces_with_them(tmp_path):
    # Memory for two 400 KiB blocks, write-back: the third write evicts the
    # least recently used leaf to disk.
    disk = str(tmp_path / "disk")
    args = ("--disk-dir", disk, "--write-policy", "write-back", "--memory-capacity", "1MiB")
    node = Node(tmp_path, "node-a", *args)
    sub = Sub(node.endpoint)
    try:
        joined(node, sub)
        a, b = Chain("t/m", "a", 2, payload=400 << 10), Chain("t/m", "b", 1, payload=400 << 10)
        a.write(node)
        b.write(node)
        sub.wait(lambda s: any(e.block_hashes == [a.hash(1)] for e in stored(s, "t/m", "DISK")))
        demoted = [e for e in stored(sub, "t/m", "DISK") if e.block_hashes == [a.hash(1)]][0]
        assert demoted.token_ids == a.tokens[BS:2 * BS], "a demoted block keeps its tokens"
        assert demoted.parent_block_hash == a.hash(0)
        assert [a.hash(1)] in [e.block_hashes for e in removed(sub, "t/m", "CPU")]
    finally:
        sub.close()
        node.stop()
    # A warm restart: consumers are told to forget the node, then its disk
    # records are announced again, with the token ids each record keeps.
    node = Node(tmp_path, "node-a", *args)
    try:
        got = replay(node.replay, 0)
        from vllm.distributed.kv_events import KVEventBatch

        dec = msgspec.msgpack.Decoder(type=KVEventBatch)
        events = [e for _, _, p in got for e in dec.decode(p).events]
        assert type(events[0]).__name__ == "AllBlocksCleared"
        assert got[0][0] == b"kv@node-a@*" and got[0][1] == 0
        disk_hashes = {e.block_hashes[0] for e in events if type(e).__name__ == "BlockStored" and e.medium == "DISK"}
        assert a.hash(1) in disk_hashes
        again = [e for e in events if type(e).__name__ == "BlockStored" and e.block_hashes == [a.hash(1)]][0]
        assert (again.token_ids, again.block_size) == (a.tokens[BS:2 * BS], BS), "its tokens, from the disk record"
        assert again.parent_block_hash == a.hash(0)
        # A reader asking the raw API for that disk record gets its bytes,
        # never the token ids the record keeps (docs/security.md, "KV events").
        m = _proto.load()
        with grpc.insecure_channel(node.server.grpc) as ch:
            got_blocks = [r.block for r in m.v1_grpc.KvTierStub(ch).Read(
                m.v1.ReadRequest(namespace="t/m", keys=[a.keys[1]]), timeout=30) if r.WhichOneof("item") == "block"]
        assert len(got_blocks) == 1 and got_blocks[0].block.payload == a.payloads[1]
        assert list(got_blocks[0].block.token_ids) == []
    finally:
        node.stop()


def test_replay_answers_from_a_sequence_number(tmp_path):
    node = Node(tmp_path, "node-r")
    sub = Sub(node.endpoint)
    try:
        joined(node, sub)
        Chain("r/m", "x", 2).write(node)
        sub.wait(lambda s: len(stored(s, "r/m", "CPU")) == 2)
        last = max(s for _, s, _ in sub.batches)
        got = replay(node.replay, 1)
        assert [n for _, n, _ in got] == list(range(1, last + 1)), "every kept batch from 1 on, in order"
        live = {n: p for _, n, p in [(t, s, b) for t, s, b in sub.batches]}
        assert all(n in live or n <= last for _, n, _ in got)
    finally:
        sub.close()
        node.stop()


def test_token_ids_must_match_the_token_count(tmp_path):
    node = Node(tmp_path, "node-t")
    try:
        with pytest.raises(KvtierError) as e:
            node.client.write("t/m", [Block(key=b"k", payload=b"p", token_count=4, token_ids=[1, 2])])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "2 token_ids for token_count 4" in str(e.value)
    finally:
        node.stop()


def test_events_carry_no_payload_bytes_and_only_the_namespaces_configured(tmp_path):
    """The attacker reads the event stream: it must never see a payload, and
    never see a namespace the operator left out of ``events.namespaces``."""
    cfg = tmp_path / "kvtier.toml"
    cfg.write_text('[events]\nnamespaces = ["public/"]\n')
    node = Node(tmp_path, "node-s", "--config", str(cfg))
    sub = Sub(node.endpoint)
    try:
        joined(node, sub, "public/warm")
        secret = b"\xa5SECRET-PAYLOAD\x5a" * 64
        node.client.write("public/m", [Block(key=b"p0", payload=secret, token_count=BS, token_ids=[7] * BS)])
        node.client.write("private/m", [Block(key=b"q0", payload=b"x" * 64, token_count=BS, token_ids=[9] * BS)])
        sub.wait(lambda s: len(stored(s, "public/m", "CPU")) == 1)
        sub.poll(0.5)
        assert sub.raw and not any(b"SECRET-PAYLOAD" in f for f in sub.raw), "payload bytes in an event"
        assert not sub.events("private/m"), "a namespace outside events.namespaces was published"
        assert all("@private/" not in t for t, _, _ in sub.batches)
    finally:
        sub.close()
        node.stop()


def test_a_non_loopback_endpoint_is_refused_without_insecure_remote(tmp_path):
    with pytest.raises(ServerError) as e:
        Node(tmp_path, "node-x", endpoint="tcp://0.0.0.0:5557")
    assert "insecure_remote" in str(e.value)
    # The same through the binary's exit status and message, as an operator sees it.
    from kvtier.server import find_binary

    r = subprocess.run([str(find_binary()), "serve", "--listen", "127.0.0.1:0", "--kv-events", "tcp://0.0.0.0:1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not loopback" in r.stderr
