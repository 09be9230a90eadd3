"""KV events into the cache-aware router's index: a ZeroMQ SUB socket per
publisher, each message decoded and applied to :class:`PrefixIndex`.

Both publishers speak vLLM's ``ZmqEventPublisher`` protocol
(``vllm/distributed/kv_events.py``): multipart ``[topic, seq (8 bytes
big-endian), payload]``, the payload a ``KVEventBatch`` in msgpack
(``[ts, [event, ...], dp_rank?]``, each event a map tagged by ``type``).

* A vLLM engine publishes when started with ``--kv-events-config
  '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint":
  "ipc:///PATH", "topic": "kv@<replica>@<model>"}'`` (vLLM binds an
  ``ipc://`` endpoint or a ``tcp://*:PORT`` one and connects to any other
  ``tcp://``); its events are its own prefix cache (medium ``GPU``).
* A kvtier node publishes with ``kvtier serve --kv-events tcp://127.0.0.1:PORT``
  on topics ``kv@<node>@<namespace>`` (``kv@<node>@*`` for
  ``AllBlocksCleared``): media ``CPU`` (its memory tier), ``DISK``,
  ``STORAGE`` (the object store). The node's name comes from the topic.

kvtier names a block by ``sha256(namespace ‖ 0x00 ‖ key)`` cut to a signed
64-bit integer, ``key`` the connector's chained key of its tokens
(docs/keys.md). A block written without its token ids is announced
without them, so :func:`kvtier_keys` computes those hashes from a prompt's
tokens to find it; it cannot for a deployment that salts its keys
(``KVTIER_KEY_SALT``), whose blocks are found only by their tokens.

Payloads are decoded with vLLM's own ``msgspec`` types when vLLM is
importable (``--event-types vllm``: a format change fails loudly), else as
plain msgpack (``msgspec`` without types, or the ``msgpack`` package).
A feed's endpoint may name the publisher's replay endpoint after a comma
(``tcp://127.0.0.1:5601,tcp://127.0.0.1:5611``: kvtier's
``--kv-events-replay``, vLLM's ``replay_endpoint``). With one, a feed that
joins late asks for everything the publisher still buffers, and a gap in the
sequence numbers is filled before the next message is applied, by the
protocol of vLLM's ``ZmqEventPublisher``: a DEALER sends ``[b"", start seq]``
and receives ``[b"", topic, seq, payload]`` per buffered message, then
``[b"", b"", -1, b""]``. What a replay does not return (no replay endpoint,
no answer within :data:`REPLAY_TIMEOUT_S`, a buffer that no longer holds it)
is counted as a gap; the index heals as blocks are stored and removed again.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .router_index import PrefixIndex
from .router_score import KeysFn

__all__ = ["Feed", "decoder", "kvtier_hash", "kvtier_keys", "parse_topic"]

log = logging.getLogger(__name__)

Decode = Callable[[bytes], list[Mapping[str, Any]]]

#: How long a replay may take before the feed gives up on it and counts the gap.
REPLAY_TIMEOUT_S = 2.0
END_SEQ = -1


def decoder(kind: str = "auto") -> tuple[Decode, str]:
    """A payload -> events function, and which decoder it is: ``vllm``
    (vLLM's ``KVEventBatch``), ``msgspec`` or ``msgpack`` (untyped)."""
    if kind in ("auto", "vllm"):
        try:
            import msgspec
            from vllm.distributed.kv_events import KVEventBatch
        except ImportError:
            if kind == "vllm":
                raise
        else:
            typed = msgspec.msgpack.Decoder(type=KVEventBatch)

            def vllm_decode(payload: bytes) -> list[Mapping[str, Any]]:
                return [{"type": type(e).__name__, **msgspec.structs.asdict(e)} for e in typed.decode(payload).events]
            return vllm_decode, "vllm"
    try:
        import msgspec

        plain: Callable[[bytes], Any] = msgspec.msgpack.decode
        name = "msgspec"
    except ImportError:
        import msgpack

        plain, name = (lambda p: msgpack.unpackb(p, raw=False, strict_map_key=False)), "msgpack"

    def untyped(payload: bytes) -> list[Mapping[str, Any]]:
        batch = plain(payload)
        return [e for e in batch[1] if isinstance(e, dict)]
    return untyped, name


def kvtier_hash(namespace: str, key: bytes) -> int:
    """kvtier's event hash of a block: the first 8 bytes of
    ``sha256(namespace ‖ 0x00 ‖ key)``, big-endian, signed; 1 for 0 (which
    reads as "no parent")."""
    h = int.from_bytes(hashlib.sha256(namespace.encode() + b"\0" + key).digest()[:8], "big", signed=True)
    return h or 1


def kvtier_keys(namespaces: Callable[[], Iterable[str]], block_size: Callable[[], int]) -> KeysFn:
    """The index keys (``(namespace, 0, hash)``, as :class:`PrefixIndex`
    stores kvtier's blocks) of a prompt's full blocks, per namespace the
    feeds have seen, at the connector's block size; unsalted keys
    (``kvtier.keys.chain``)."""
    try:
        from kvtier.keys import chain
    except ImportError:  # a checkout without the SDK installed: the one beside perf/
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
        from kvtier.keys import chain

    def keys(tokens: Sequence[int]) -> list[tuple[int, list[Hashable]]]:
        bs = block_size()
        if bs <= 0:
            return []
        chained = chain(tokens, bs)
        return [(bs, [(ns, 0, kvtier_hash(ns, k)) for k in chained]) for ns in namespaces()]
    return keys


def parse_topic(topic: str) -> tuple[str, str]:
    """``kv@<node>@<namespace>`` -> (node, namespace); ("", "") otherwise."""
    parts = topic.split("@", 2)
    if len(parts) != 3 or parts[0] != "kv":
        return "", ""
    return parts[1], parts[2]


class Feed:
    """One publisher (``ENDPOINT[,REPLAY_ENDPOINT]``). ``engine``: the index
    source of that replica's engine (its topic is not read); otherwise a
    kvtier node, named by its topics, whose namespaces starting with
    ``namespace`` are kept."""

    def __init__(self, endpoint: str, index: PrefixIndex, decode: Decode, engine: str | None = None,
                 namespace: str = ""):
        live, _, replay = endpoint.partition(",")
        self.endpoint, self.replay = live, replay or None
        self.index, self.decode = index, decode
        self.engine, self.namespace = engine, namespace
        self.nodes: set[str] = set()
        self.namespaces: set[str] = set()
        self.messages = self.gaps = self.errors = self.skipped = self.replayed = 0
        self._seq: int | None = None

    @staticmethod
    def seq(frames: list[bytes]) -> int | None:
        """A message's sequence number; None for a malformed message."""
        return int.from_bytes(frames[1], "big", signed=True) if len(frames) == 3 and len(frames[1]) == 8 else None

    def missing(self, seq: int) -> int | None:
        """The first sequence number missed before ``seq`` (0 for a feed that
        has seen nothing and joined after message 0), None when none is."""
        if self._seq is None:
            return 0 if seq > 0 else None
        return self._seq + 1 if seq > self._seq + 1 else None

    def handle(self, frames: list[bytes]) -> None:
        """Applies one message (``[topic, seq, payload]``)."""
        seq = self.seq(frames)
        if seq is None:
            self.errors += 1
            return
        topic, _, payload = frames
        if self._seq is not None and seq > self._seq + 1:
            self.gaps += seq - self._seq - 1
        self._seq = seq
        self.messages += 1
        try:
            events = self.decode(payload)
        except Exception as e:  # noqa: BLE001 - one bad message must not stop the feed
            self.errors += 1
            log.warning("%s: undecodable KV event batch (%s)", self.endpoint, e)
            return
        if self.engine is not None:
            self.index.apply(self.index.source(self.engine, "engine", self.engine), events)
            return
        node, ns = parse_topic(topic.decode("utf-8", "replace"))
        if not node:
            self.skipped += 1
            return
        self.nodes.add(node)
        src = self.index.source(node, "kvtier", "kvtier")
        if ns == "*":
            self.index.apply(src, [e for e in events if e.get("type") == "AllBlocksCleared"])
        elif ns.startswith(self.namespace):
            self.namespaces.add(ns)
            self.index.apply(src, events, scope=ns)
        else:
            self.skipped += 1

    async def fill(self, sock: Any, start: int, until: int) -> None:
        """Replays messages ``start <= seq < until`` through ``sock`` (a
        DEALER on the replay endpoint), applying them in order; stops at the
        end marker or after :data:`REPLAY_TIMEOUT_S`."""
        import zmq

        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big", signed=True)], flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("%s: replay endpoint %s not connected; %d message(s) lost", self.endpoint, self.replay,
                        until - start)
            return
        deadline = asyncio.get_running_loop().time() + REPLAY_TIMEOUT_S
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            if not await sock.poll(left * 1000):
                break
            reply = await sock.recv_multipart()
            frames = reply[1:] if reply and reply[0] == b"" else reply
            seq = self.seq(frames)
            if seq is None or seq == END_SEQ:
                return
            if (self._seq is None or seq > self._seq) and start <= seq < until:
                self.handle(frames)
                self.replayed += 1
        log.warning("%s: replay from %s gave no end marker within %.0f s", self.endpoint, self.replay,
                    REPLAY_TIMEOUT_S)

    async def run(self) -> None:
        """Receives until cancelled; fills gaps first when it has a replay endpoint."""
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.connect(self.endpoint)
        replay = None
        if self.replay:
            replay = ctx.socket(zmq.DEALER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.connect(self.replay)
        try:
            while True:
                frames = await sock.recv_multipart()
                seq = self.seq(frames)
                if replay is not None and seq is not None and (start := self.missing(seq)) is not None:
                    await self.fill(replay, start, seq)
                self.handle(frames)
        finally:
            sock.close(linger=0)
            if replay is not None:
                replay.close(linger=0)

    def stats(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "engine": self.engine, "nodes": sorted(self.nodes),
                "namespaces": sorted(self.namespaces),
                "messages": self.messages, "gaps": self.gaps, "errors": self.errors, "skipped": self.skipped,
                "replay": self.replay, "replayed": self.replayed}
