"""The golden data-plane frames of tests/vectors/wire.json (also checked by
crates/kvtier-proto/tests/wire_vectors.rs): the SDK's framing encodes each
described message to exactly those bytes and decodes those bytes back, and
kvtier.wire's pool puts exactly those bytes on a socket and makes sense of
the replies. A change to the encoding on either side fails here or in Rust.
"""
from __future__ import annotations

import itertools
import json
import socket
import threading
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from kvtier import KvtierError
from kvtier.pb import v1
from kvtier.pb import wire as wpb
from kvtier.wire import HEADER, MAGIC, Kind, WirePool

VECTORS = Path(__file__).resolve().parents[2] / "tests" / "vectors" / "wire.json"
DOC = json.loads(VECTORS.read_text())
FRAMES = {f["name"]: f for f in DOC["frames"]}
KIND_OF = {"Read": Kind.READ, "Write": Kind.WRITE, "Hello": Kind.HELLO, "ReadReply": Kind.READ_REPLY,
           "WriteReply": Kind.WRITE_REPLY, "HelloReply": Kind.HELLO_REPLY, "Error": Kind.ERROR}
MESSAGES = {m.DESCRIPTOR.full_name: m for m in (
    wpb.WireHello, wpb.WireWriteRequest, wpb.WireReadRequest, wpb.WireReadReply, wpb.WireError, v1.WriteResponse)}
#: Kinds whose metadata lists the lengths of the payloads that follow it.
WITH_PAYLOADS = {"Write", "ReadReply"}
TIMEOUT = 10.0  # the clients ask the server for 90% of it: the vectors' timeout_ms 9000


def message(f: dict):
    """The frame's metadata message, built from the vector's JSON description."""
    if f["meta_type"] is None:
        return None
    return json_format.ParseDict(f["meta"], MESSAGES[f["meta_type"]]())


def test_the_vectors_cover_every_kind():
    assert DOC["version"] == 1 and "gen_wire.py" in DOC["about"]
    assert {f["kind"] for f in DOC["frames"]} == set(KIND_OF)
    assert any(p == "" for f in DOC["frames"] for p in f["payloads_hex"]), "a zero-length payload"


@pytest.mark.parametrize("name", list(FRAMES))
def test_encoding_gives_the_golden_bytes(name):
    f = FRAMES[name]
    assert KIND_OF[f["kind"]] == f["kind_byte"]
    m = message(f)
    meta = m.SerializeToString() if m is not None else b""
    data = b"".join(bytes.fromhex(p) for p in f["payloads_hex"])
    raw = HEADER.pack(MAGIC, KIND_OF[f["kind"]], 0, 0, f["request_id"], len(meta), len(data)) + meta + data
    assert raw.hex() == f["frame_hex"]


@pytest.mark.parametrize("name", list(FRAMES))
def test_decoding_the_golden_bytes(name):
    f = FRAMES[name]
    raw = bytes.fromhex(f["frame_hex"])
    magic, kind, flags, reserved, rid, meta_len, data_len = HEADER.unpack_from(raw)
    assert (magic, kind, flags, reserved, rid) == (MAGIC, KIND_OF[f["kind"]], 0, 0, f["request_id"])
    assert HEADER.size + meta_len + data_len == len(raw)
    meta = raw[HEADER.size:HEADER.size + meta_len]
    data = raw[HEADER.size + meta_len:]
    if f["meta_type"] is None:
        assert meta == b""
    else:
        m = MESSAGES[f["meta_type"]].FromString(meta)
        assert m == message(f)
        assert json_format.MessageToDict(m, preserving_proto_field_name=True) == f["meta"]
    lengths = list(message(f).payload_lengths) if f["kind"] in WITH_PAYLOADS else []
    assert sum(lengths) == data_len
    pos, payloads = 0, []
    for n in lengths:
        payloads.append(data[pos:pos + n].hex())
        pos += n
    assert payloads == f["payloads_hex"]


class ScriptedPeer:
    """A data-plane server that records each request frame's raw bytes and
    answers it with the next golden frame of ``replies``."""

    def __init__(self, replies: list[bytes]):
        self.replies = list(replies)
        self.received: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = self.sock.getsockname()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def _recv(conn: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            b = conn.recv(n - len(buf))
            if not b:
                raise ConnectionError("closed")
            buf += b
        return buf

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            try:
                while self.replies:
                    head = self._recv(conn, HEADER.size)
                    *_, meta_len, data_len = HEADER.unpack(head)
                    self.received.append(head + self._recv(conn, meta_len + data_len))
                    conn.sendall(self.replies.pop(0))
            except (ConnectionError, OSError):
                pass

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=10)


def golden(name: str) -> bytes:
    return bytes.fromhex(FRAMES[name]["frame_hex"])


def test_the_pool_sends_and_understands_the_golden_frames():
    """Through WirePool, the code the client uses: Hello, Write, Read and an Error reply."""
    write, read = message(FRAMES["write"]), message(FRAMES["read"])
    peer = ScriptedPeer([golden("hello-reply"), golden("write-reply"), golden("read-reply"), golden("error")])
    pool = WirePool(peer.addr, connections=1, token=message(FRAMES["hello"]).token,
                    max_reply=read.max_reply_bytes)
    pool._ids = itertools.count(FRAMES["write"]["request_id"])  # the vectors' request ids, in order
    try:
        payloads = [bytes.fromhex(p) for p in FRAMES["write"]["payloads_hex"]]
        resp = pool.write(write.request.namespace, list(write.request.blocks), payloads, TIMEOUT)
        assert resp == message(FRAMES["write-reply"])

        reply, data = pool.read(read.request.namespace, list(read.request.keys), read.request.lease_id, TIMEOUT)
        assert reply == message(FRAMES["read-reply"])
        assert [bytes(p).hex() for p in data] == FRAMES["read-reply"]["payloads_hex"]

        with pytest.raises(KvtierError) as ei:
            pool.write(write.request.namespace, [], [], TIMEOUT)
        err = message(FRAMES["error"])
        assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.code == 8
        assert ei.value.message == err.message
    finally:
        pool.close()
        peer.close()
    assert [r.hex() for r in peer.received[:3]] == [FRAMES[n]["frame_hex"] for n in ("hello", "write", "read")]
    assert len(peer.received) == 4
