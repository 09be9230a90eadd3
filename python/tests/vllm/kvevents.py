"""kvtier nodes publishing KV events (docs/events.md) and a subscriber that
decodes them with vLLM's own types (``vllm.distributed.kv_events``): the
pieces test_kv_events.py and test_kv_events_llmd.py share.

Each node is a real ``kvtier serve`` on loopback with ephemeral ports; the
subscriber is a pyzmq SUB socket, as vLLM's consumers use.
"""
from __future__ import annotations

import random
import socket
import time
from pathlib import Path
from typing import Any

import zmq

from kvtier import Block, Client
from kvtier.server import Server

from llmd import int64_hash

#: Tokens per block in these tests (each block's token_ids, and llm-d's block size).
BS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """One kvtier node with ``--kv-events`` (and a replay endpoint)."""

    def __init__(self, workdir: Path, name: str, *args: str, grpc_port: int | None = None,
                 endpoint: str | None = None):
        self.name = name
        self.endpoint = endpoint or f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}"
        listen = f"127.0.0.1:{grpc_port or 0}"
        named = ["--kv-events-node", name] if grpc_port is None else []  # (a cluster's are its --cluster-self)
        self.server = Server.start(
            listen=listen, args=["--kv-events", self.endpoint, "--kv-events-replay", self.replay, *named, *args])
        self.client = Client(self.server.grpc)

    def stop(self) -> None:
        self.client.close()
        self.server.stop()


class Chain:
    """``n`` blocks of BS tokens in namespace ``ns``, keyed as a chain."""

    def __init__(self, ns: str, name: str, n: int, payload: int = 1024):
        rng = random.Random(name)
        self.ns = ns
        self.tokens = [rng.randrange(1, 50_000) for _ in range(n * BS)]
        self.keys = [f"{name}-{i}".encode() for i in range(n)]
        self.payloads = [bytes([i % 251]) * payload for i in range(n)]

    def block(self, i: int, tokens: bool = True) -> Block:
        return Block(key=self.keys[i], payload=self.payloads[i], parent=self.keys[i - 1] if i else None,
                     token_count=BS, token_ids=self.tokens[i * BS:(i + 1) * BS] if tokens else ())

    def write(self, node: Node, upto: int | None = None, tokens: bool = True) -> None:
        node.client.write(self.ns, [self.block(i, tokens) for i in range(upto or len(self.keys))])

    def hash(self, i: int) -> int:
        """The hash kvtier publishes block ``i`` under (docs/events.md)."""
        return int64_hash(self.ns, self.keys[i])


class Sub:
    """A SUB socket on a node's endpoint, decoding with vLLM's KVEventBatch."""

    def __init__(self, endpoint: str, topic: str = "kv@"):
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)
        #: Every batch received: (topic, seq, KVEventBatch).
        self.batches: list[tuple[str, int, Any]] = []
        #: Every frame as received.
        self.raw: list[bytes] = []

    def poll(self, timeout: float = 0.2) -> None:
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000)):
                return
            topic, seq, payload = self.sock.recv_multipart()
            self.raw += [topic, seq, payload]
            self.batches.append((topic.decode(), int.from_bytes(seq, "big"), self.decoder.decode(payload)))

    def events(self, ns: str | None = None) -> list[Any]:
        return [e for t, _, b in self.batches if ns is None or t.endswith("@" + ns) for e in b.events]

    def wait(self, pred, timeout: float = 15.0) -> list[Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.poll(0.1)
            if pred(self):
                return self.events()
        raise AssertionError(f"events not seen within {timeout}s; got {self.events()}")

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def joined(node: Node, sub: Sub, ns: str = "warm/up") -> None:
    """Writes throwaway blocks until the subscriber sees one (ZMQ's slow
    joiner: what a PUB sends before a SUB's subscription arrives is lost)."""
    for i in range(200):
        b = Block(key=f"w{i}".encode(), payload=b"x", token_count=1, token_ids=[i])
        node.client.write(ns, [b])
        sub.poll(0.05)
        if sub.events(ns):
            return
    raise AssertionError("the subscriber never received an event")


def replay(endpoint: str, start: int, timeout: float = 10.0) -> list[tuple[bytes, int, bytes]]:
    """Asks a replay endpoint for every batch from ``start`` on, as vLLM's
    ``ZmqEventPublisher`` expects (``[identity, "", 8-byte big-endian start]``
    at its ROUTER: a DEALER sending ``["", start]``, which unlike a REQ can
    take the several answers), up to the end marker (sequence -1)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    try:
        s.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            if not s.poll(int(timeout * 1000)):
                raise AssertionError(f"no end of replay within {timeout}s; got {len(out)} batches")
            empty, topic, seq, payload = s.recv_multipart()
            assert empty == b""
            n = int.from_bytes(seq, "big", signed=True)
            if n == -1:
                return out
            out.append((topic, n, payload))
    finally:
        s.close(0)
        ctx.term()
