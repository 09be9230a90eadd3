"""The Python client's data plane (the Rust client core, kvtier._native)
against misbehaving peers: a Python socket server speaking the frame format
(tests/frames.py) that lies about checksums, breaks the protocol, sheds,
sends error frames or stays silent. The client must turn each into the right
``KvtierError`` and retry only what is retryable. Against the real server:
test_dataplane.py."""
from __future__ import annotations

import os
import socket
import threading
import time

import grpc
import pytest

import kvtier.retry
from kvtier import Block, Client, KvtierError
from kvtier._crc import crc32c
from kvtier.dataplane import DataPlane
from kvtier.pb import v1 as pb
from kvtier.pb import wire as wpb

from frames import HEADER, Kind, frame


class FakePeer:
    """A one-thread TCP server answering each frame with ``reply(header, meta, data, conn)``."""

    def __init__(self, reply):
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = self.sock.getsockname()
        self.requests = 0
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _recv(self, conn, n):
        buf = b""
        while len(buf) < n:
            b = conn.recv(n - len(buf))
            if not b:
                raise ConnectionError("closed")
            buf += b
        return buf

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    while True:
                        h = HEADER.unpack(self._recv(conn, HEADER.size))
                        meta = self._recv(conn, h[5])
                        data = self._recv(conn, h[6])
                        self.requests += 1
                        if self.reply(h, meta, data, conn) is False:
                            break
                except (ConnectionError, OSError):
                    pass

    def close(self):
        self._stop = True
        self.sock.close()


def read_reply(rid: int, payload: bytes, crc: int) -> bytes:
    meta = wpb.WireReadReply(
        blocks=[pb.ReadBlock(index=0, tier=1, block=pb.Block(key=b"k", crc32c=crc))],
        payload_lengths=[len(payload)],
        done=pb.ReadDone(requested=1),
    ).SerializeToString()
    return frame(Kind.READ_REPLY, rid, meta, payload)


@pytest.fixture
def fake_client():
    """A client whose data plane is ``peer`` (its gRPC side is never used)."""
    made = []

    def make(reply, timeout=3.0, retries=1):
        peer = FakePeer(reply)
        c = Client("127.0.0.1:1", connections=1, timeout=timeout, retries=retries)
        c._wire.pool = DataPlane(f"{peer.addr[0]}:{peer.addr[1]}", connections=1, timeout=timeout)
        c._wire.known = True
        made.append((peer, c))
        return peer, c

    yield make
    for peer, c in made:
        c.close()
        peer.close()


def test_a_lying_server_is_caught(fake_client):
    payload = os.urandom(100_000)

    def lie(h, meta, data, conn):
        conn.sendall(read_reply(h[4], payload, crc32c(payload) ^ 1))

    peer, c = fake_client(lie)
    with pytest.raises(KvtierError) as ei:
        c.read("ns", [b"k"])
    assert ei.value.code == grpc.StatusCode.DATA_LOSS
    assert peer.requests == 1, "DATA_LOSS is not retried"

    # The honest answer goes through, payload intact.
    peer.reply = lambda h, m, d, conn: conn.sendall(read_reply(h[4], payload, crc32c(payload)))
    r = c.read("ns", [b"k"])
    assert r.payloads == [payload] and r.blocks[0].key == b"k"


@pytest.mark.parametrize(
    "answer, expect",
    [
        (lambda rid: frame(Kind.READ_REPLY, rid, b"", magic=b"HTTP"), "not a kvtier data-plane peer"),
        (lambda rid: frame(Kind.READ_REPLY, rid + 1, b""), "while waiting for"),
        (
            lambda rid: frame(
                Kind.READ_REPLY,
                rid,
                wpb.WireReadReply(blocks=[pb.ReadBlock(block=pb.Block(key=b"k"))], payload_lengths=[10]).SerializeToString(),
                b"x" * 4,
            ),
            "add up to",
        ),
        (lambda rid: frame(Kind.READ_REPLY, rid, b"\xff\xff\xff"), "bad read reply"),
        (lambda rid: frame(Kind.WRITE_REPLY, rid, b"", b"x" * 10)[:30], "end of file"),
    ],
    ids=["magic", "request-id", "lengths", "metadata", "truncated"],
)
def test_protocol_violations_are_unavailable_and_retried(fake_client, answer, expect):
    def reply(h, meta, data, conn):
        conn.sendall(answer(h[4]))
        return False  # close the connection after answering

    peer, c = fake_client(reply, retries=1)
    with pytest.raises(KvtierError) as ei:
        c.read("ns", [b"k"])
    assert ei.value.code == grpc.StatusCode.UNAVAILABLE
    assert expect in ei.value.message
    assert peer.requests == 2, "retried once on a fresh connection"
    # The same for a read into the caller's buffers.
    with pytest.raises(KvtierError) as ei:
        c.read_into("ns", [b"k"], [bytearray(16)])
    assert ei.value.code == grpc.StatusCode.UNAVAILABLE and expect in ei.value.message


def test_error_frames_carry_the_servers_status(fake_client):
    def reply(h, meta, data, conn):
        e = wpb.WireError(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message="no room").SerializeToString()
        conn.sendall(frame(Kind.ERROR, 0, e))

    peer, c = fake_client(reply)
    with pytest.raises(KvtierError) as ei:
        c.write("ns", [Block(b"k", b"v")])
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ei.value.message == "no room"


def test_a_shed_request_is_retried_after_the_servers_hint(fake_client, monkeypatch):
    """A shed request's error frame carries the server's retry hint; the
    client waits at least that long (jittered above it) before retrying."""
    def shed(h, meta, data, conn):
        e = wpb.WireError(code=grpc.StatusCode.UNAVAILABLE.value[0], message="server overloaded", retry_pushback_ms=250)
        conn.sendall(frame(Kind.ERROR, h[4], e.SerializeToString()))

    peer, c = fake_client(shed, retries=0)
    with pytest.raises(KvtierError) as ei:
        c.read("ns", [b"k"])
    assert ei.value.code == grpc.StatusCode.UNAVAILABLE
    assert ei.value.retry_after == pytest.approx(0.25)

    pauses = []
    monkeypatch.setattr(kvtier.retry.time, "sleep", pauses.append)
    peer2, c2 = fake_client(shed, retries=2)
    with pytest.raises(KvtierError):
        c2.read("ns", [b"k"])
    assert len(pauses) == 2 and all(0.25 <= p <= 0.375 for p in pauses), pauses


def test_a_silent_server_hits_the_deadline(fake_client):
    release = threading.Event()
    peer, c = fake_client(lambda h, m, d, conn: release.wait(10), timeout=0.5, retries=0)
    t0 = time.monotonic()
    with pytest.raises(KvtierError) as ei:
        c.read("ns", [b"k"])
    took = time.monotonic() - t0
    release.set()
    assert ei.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.4 < took < 2.0, took
    # The server is asked to give up at 90% of the deadline.
    sent = []
    peer.reply = lambda h, m, d, conn: sent.append(wpb.WireReadRequest.FromString(m).timeout_ms) or False
    with pytest.raises(KvtierError):
        c.read("ns", [b"k"])
    assert sent and 300 <= sent[0] <= 450, sent


def test_read_into_still_checks_the_checksum(fake_client):
    payload = os.urandom(50_000)
    peer, c = fake_client(lambda h, m, d, conn: conn.sendall(read_reply(h[4], payload, crc32c(payload) ^ 1)))
    buf = bytearray(50_000)
    with pytest.raises(KvtierError) as ei:
        c.read("ns", [b"k"], into=lambda i, n: buf)
    assert ei.value.code == grpc.StatusCode.DATA_LOSS
    with pytest.raises(KvtierError) as ei:
        c.read_into("ns", [b"k"], [buf])
    assert ei.value.code == grpc.StatusCode.DATA_LOSS
