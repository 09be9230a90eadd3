"""The cache-aware router's event path (perf/serving/router_events.py,
docs/serving.md "Cache-aware routing") against vLLM's own publisher,
``ZmqEventPublisher``, with no engine: a vLLM ``KVEventBatch`` and a batch in
kvtier's form (int64 hashes, ``medium``/``locality``/``ownership``, topic
``kv@<node>@<namespace>``) decode with vLLM's types and without, land in
the index, and the router in ``cache-aware`` mode sends requests to the
stand-in backend whose engine announced the prompt's blocks.
"""
from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import msgspec
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvtier.server import REPO_ROOT

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from perf.serving.router import CacheAware, make_app
from perf.serving.router_events import REPLAY_TIMEOUT_S, Feed, decoder, parse_topic
from perf.serving.router_index import PrefixIndex
from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher

PROMPT = list(range(1000, 1200))  # 200 tokens
BS = 16


def _kvtier_payload(node_blocks: int, bs: int = 32) -> bytes:
    events = [{"type": "BlockStored", "block_hashes": [-(1 << 63) + i], "parent_block_hash": -(1 << 63) + i - 1 if i
               else None, "token_ids": PROMPT[i * bs:(i + 1) * bs], "block_size": bs, "lora_id": None,
               "medium": "CPU", "lora_name": None, "locality": "LOCAL", "ownership": "kvtier:127.0.0.1:7001"}
              for i in range(node_blocks)]
    return msgspec.msgpack.encode([time.time(), events])


def _vllm_batch(blocks: int, tag: bytes) -> KVEventBatch:
    return KVEventBatch(ts=time.time(), events=[BlockStored(
        block_hashes=[tag + bytes([i]) * 31 for i in range(blocks)], parent_block_hash=None,
        token_ids=PROMPT[:blocks * BS], block_size=BS, lora_id=None, medium="GPU", lora_name=None, group_idx=0)])


def test_both_forms_decode_with_and_without_vllm_types():
    for kind in ("vllm", "plain"):
        decode, name = decoder(kind)
        assert name == ("vllm" if kind == "vllm" else "msgspec")
        index = PrefixIndex()
        eng = Feed("e", index, decode, engine="engine:a")
        eng.handle([b"kv@a@m", (0).to_bytes(8, "big"), msgspec.msgpack.encode(_vllm_batch(3, b"x"))])
        kv = Feed("k", index, decode, namespace="vllm/")
        kv.handle([b"kv@127.0.0.1:7001@vllm/small/abc", (0).to_bytes(8, "big"), _kvtier_payload(4)])
        kv.handle([b"kv@127.0.0.1:7001@vllm/small/abc", (5).to_bytes(8, "big"), _kvtier_payload(1)])
        kv.handle([b"kv@127.0.0.1:7001@other/ns", (6).to_bytes(8, "big"), _kvtier_payload(1)])
        assert index.sources["engine:a"].run(PROMPT)[0:1] == (BS,) and len(index.sources["engine:a"].run(PROMPT)[1]) == 3
        bs, run = index.sources["127.0.0.1:7001"].run(PROMPT)
        assert (bs, len(run), run[0]) == (32, 4, {"CPU"}), kind
        assert kv.nodes == {"127.0.0.1:7001"} and kv.gaps == 4 and kv.skipped == 1
        kv.handle([b"kv@127.0.0.1:7001@*", (7).to_bytes(8, "big"),
                   msgspec.msgpack.encode([time.time(), [{"type": "AllBlocksCleared"}]])])
        assert index.sources["127.0.0.1:7001"].run(PROMPT)[1] == []
        kv.handle([b"kv@x@y", (8).to_bytes(8, "big"), b"\xc1 not msgpack"])
        assert kv.errors == 1
    assert parse_topic("kv@127.0.0.1:7001@vllm/a/b@c") == ("127.0.0.1:7001", "vllm/a/b@c")
    assert parse_topic("other") == ("", "")


def test_router_follows_the_engine_events_of_vllms_publisher():
    tmp = Path(tempfile.mkdtemp(prefix="kvr-"))
    eps = [f"ipc://{tmp}/e{i}" for i in range(2)]
    pubs = [ZmqEventPublisher(0, endpoint=ep, topic=f"kv@r{i}@m") for i, ep in enumerate(eps)]

    async def go():
        seen: dict[str, int] = {"a": 0, "b": 0}

        def backend(name):
            async def completions(request):
                await request.json()
                seen[name] += 1
                resp = web.StreamResponse()
                await resp.prepare(request)
                await resp.write(f"data: {name}\n\n".encode())
                await resp.write_eof()
                return resp

            async def tokenize(request):
                body = await request.json()
                return web.json_response({"tokens": [int(t) for t in body["prompt"].split()]})
            app = web.Application()
            app.router.add_post("/v1/completions", completions)
            app.router.add_post("/tokenize", tokenize)
            return app

        servers = [TestServer(backend("a")), TestServer(backend("b"))]
        for s in servers:
            await s.start_server()
        urls = [str(s.make_url("")).rstrip("/") for s in servers]
        cache = CacheAware(urls, eps, event_types="vllm")
        client = TestClient(TestServer(make_app(urls, "cache-aware", cache=cache)))
        await client.start_server()
        # engine b holds 10 blocks of the prompt, a 2; republished until the
        # SUB sockets have joined (ZeroMQ drops what a publisher sends first)
        for _ in range(100):
            pubs[0].publish(_vllm_batch(2, b"a"))
            pubs[1].publish(_vllm_batch(10, b"b"))
            await asyncio.sleep(0.05)
            st = (await (await client.get("/stats")).json())["cache_aware"]["index"]["sources"]
            if len(st) == 2:
                break
        got = []
        for prompt in (" ".join(map(str, PROMPT)), PROMPT, PROMPT[:20] + [5] * 50):
            r = await client.post("/v1/completions", json={"model": "m", "prompt": prompt, "stream": True})
            got.append((await r.read()).decode())
        stats = await (await client.get("/stats")).json()
        await client.close()
        for s in servers:
            await s.close()
        return got, stats

    try:
        got, stats = asyncio.run(go())
    finally:
        for p in pubs:
            p.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    ca = stats["cache_aware"]
    # the text prompt (through /tokenize) and the token prompt go to b; a
    # prompt whose first 16-token block only both hold is a tie: round-robin from b onwards, so a
    assert got == ["data: b\n\n", "data: b\n\n", "data: a\n\n"], (got, ca)
    assert ca["decoder"] == "vllm" and ca["routed"] == 3
    assert ca["credited_tokens"]["engine"] == 2 * 160 + 16 and ca["credited_tokens"]["prompt"] == 400 + 70
    assert ca["load"] == {"inflight": [0, 0], "pending_prefill": [0.0, 0.0], "active": [0.0, 0.0]}


def _other_batch(i: int) -> KVEventBatch:
    """One block no prompt here shares, so only the first batch decides what PROMPT finds."""
    return KVEventBatch(ts=time.time(), events=[BlockStored(
        block_hashes=[bytes([i % 256]) * 32], parent_block_hash=None, token_ids=[5000 + i] * BS, block_size=BS,
        lora_id=None, medium="GPU", lora_name=None, group_idx=0)])


def test_a_late_feed_replays_what_vllms_publisher_sent_before_it_joined():
    tmp = Path(tempfile.mkdtemp(prefix="kvr-"))
    pub = ZmqEventPublisher(0, endpoint=f"ipc://{tmp}/e", replay_endpoint=f"ipc://{tmp}/r", topic="kv@r0@m")
    index = PrefixIndex()
    feed = Feed(f"ipc://{tmp}/e,ipc://{tmp}/r", index, decoder("vllm")[0], engine="engine:a")

    async def go():
        # Sent before any subscriber exists: reachable only through the replay buffer.
        pub.publish(_vllm_batch(3, b"p"))
        for i in range(5):
            pub.publish(_other_batch(i))
        await asyncio.sleep(0.3)
        task = asyncio.create_task(feed.run())
        for i in range(5, 200):
            pub.publish(_other_batch(i))
            await asyncio.sleep(0.02)
            if feed.messages >= 10:
                break
        task.cancel()

    try:
        asyncio.run(go())
    finally:
        pub.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    assert feed.replay == f"ipc://{tmp}/r" and feed.endpoint == f"ipc://{tmp}/e"
    # Every message from 0 on was applied once, in order: nothing counted lost.
    assert feed.replayed >= 6 and feed.gaps == 0 and feed.errors == 0, feed.stats()
    assert feed.messages == feed._seq + 1, feed.stats()
    assert len(index.sources["engine:a"].run(PROMPT)[1]) == 3, feed.stats()


def test_a_gap_is_filled_from_the_replay_buffer_in_order():
    import zmq
    import zmq.asyncio

    tmp = Path(tempfile.mkdtemp(prefix="kvr-"))
    pub = ZmqEventPublisher(0, endpoint=f"ipc://{tmp}/e", replay_endpoint=f"ipc://{tmp}/r", topic="kv@r0@m")
    index = PrefixIndex()
    feed = Feed(f"ipc://{tmp}/e,ipc://{tmp}/r", index, decoder("vllm")[0], engine="engine:a")
    enc = msgspec.msgpack.Encoder()

    def frame(seq: int, batch: KVEventBatch) -> list[bytes]:
        return [b"kv@r0@m", seq.to_bytes(8, "big"), enc.encode(batch)]

    async def go():
        pub.publish(_other_batch(0))
        pub.publish(_vllm_batch(3, b"p"))  # seq 1: the message this feed "missed"
        for i in range(2, 6):
            pub.publish(_other_batch(i))
        await asyncio.sleep(0.3)
        feed.handle(frame(0, _other_batch(0)))
        sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        sock.connect(feed.replay)
        try:
            assert feed.missing(4) == 1 and feed.missing(1) is None
            await feed.fill(sock, 1, 4)  # seq 1, 2, 3 of the six buffered
        finally:
            sock.close(linger=0)
        feed.handle(frame(4, _other_batch(4)))

    try:
        asyncio.run(go())
    finally:
        pub.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    assert (feed.replayed, feed.messages, feed.gaps, feed._seq) == (3, 5, 0, 4), feed.stats()
    assert len(index.sources["engine:a"].run(PROMPT)[1]) == 3


def test_a_replay_endpoint_that_never_answers_costs_a_timeout_not_the_feed():
    tmp = Path(tempfile.mkdtemp(prefix="kvr-"))
    pub = ZmqEventPublisher(0, endpoint=f"ipc://{tmp}/e", topic="kv@r0@m")  # no replay socket
    index = PrefixIndex()
    feed = Feed(f"ipc://{tmp}/e,ipc://{tmp}/nobody", index, decoder("vllm")[0], engine="engine:a")

    async def go():
        task = asyncio.create_task(feed.run())
        t0 = time.monotonic()
        for i in range(400):
            pub.publish(_other_batch(i))
            await asyncio.sleep(0.02)
            if feed.messages >= 3:
                break
        task.cancel()
        return time.monotonic() - t0

    try:
        took = asyncio.run(go())
    finally:
        pub.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    assert feed.messages >= 3 and feed.replayed == 0, feed.stats()
    assert took < 8 * REPLAY_TIMEOUT_S, took
