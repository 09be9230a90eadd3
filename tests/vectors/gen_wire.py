#!/usr/bin/env python3
"""Generates tests/vectors/wire.json: golden data-plane frames (docs/wire.md).

Run from the repository root: PYTHONPATH=python .venv/bin/python tests/vectors/gen_wire.py > tests/vectors/wire.json

The frames are built here from the layout in docs/wire.md with struct and the
protobuf messages of proto/kvtier/v1/wire.proto, not with either
implementation's framing code. The Rust test (crates/kvtier-proto/tests/wire_vectors.rs)
builds each message itself, encodes it and compares bytes with "frame_hex",
and decodes "frame_hex" back (the Python SDK uses the Rust client core). Re-run only when adding frames; never edit bytes by hand: a
frame that changes is a wire-format change.

Header (24 bytes, little-endian): magic "KVW1" | kind u8 | flags u8 (0) |
reserved u16 (0) | request id u64 | meta_len u32 | data_len u32; then meta_len
bytes of protobuf metadata, then data_len bytes of payloads, concatenated.
"""
import json
import struct
import sys

from google.protobuf import json_format

from kvtier._crc import crc32c
from kvtier.pb import v1, wire

HEADER = struct.Struct("<4sBBHQII")
KINDS = {"Read": 1, "Write": 2, "Hello": 3, "ReadReply": 0x81, "WriteReply": 0x82, "HelloReply": 0x83, "Error": 0xFF}

NAMESPACE = "tenant-a/model-x"
KEYS = [bytes.fromhex(h) for h in ("0011223344556677", "8899aabbccddeeff", "0123456789abcdef", "fedcba9876543210")]
# Block 0 and 2 carry bytes, block 1 an empty payload (a zero-length data segment).
PAYLOADS = [b"KV block 0: " + bytes(range(25)), b"", bytes((i * 7) % 256 for i in range(300))]
WRITE_ID = 0x0102030405060708  # every byte differs: a byte-order or width mistake shows
READ_ID = WRITE_ID + 1
ERROR_ID = WRITE_ID + 2
TIMEOUT_MS = 9000  # what both clients send for a 10 s call (90%)


def blocks(with_tier: bool):
    out = []
    for i, (key, payload) in enumerate(zip(KEYS, PAYLOADS)):
        b = v1.Block(
            key=key,
            parent_key=KEYS[i - 1] if i else b"",
            token_count=16 if i == 2 else 128,
            crc32c=crc32c(payload),
            ttl_ms=60_000 if i == 1 and not with_tier else 0,
        )
        out.append(v1.ReadBlock(index=i, block=b, tier=[v1.TIER_MEMORY, v1.TIER_DISK, v1.TIER_OBJECT][i])
                   if with_tier else b)
    return out


def timing(total: int):
    return v1.ServerTiming(queue_us=3, service_us=total - 10, storage_memory_us=40, storage_disk_us=120,
                           storage_object_us=0, total_us=total)


def frames():
    lengths = [len(p) for p in PAYLOADS]
    yield "hello", "Hello", 0, wire.WireHello(token="s3cret-token"), []
    yield "hello-reply", "HelloReply", 0, None, []
    yield "write", "Write", WRITE_ID, wire.WireWriteRequest(
        request=v1.WriteRequest(namespace=NAMESPACE, blocks=blocks(with_tier=False)),
        payload_lengths=lengths, timeout_ms=TIMEOUT_MS), PAYLOADS
    yield "write-reply", "WriteReply", WRITE_ID, v1.WriteResponse(stored=2, existing=1, timing=timing(260)), []
    yield "read", "Read", READ_ID, wire.WireReadRequest(
        request=v1.ReadRequest(namespace=NAMESPACE, keys=KEYS, lease_id=42),
        timeout_ms=TIMEOUT_MS, max_reply_bytes=512 << 20), []
    yield "read-reply", "ReadReply", READ_ID, wire.WireReadReply(
        blocks=blocks(with_tier=True), payload_lengths=lengths,
        done=v1.ReadDone(returned=3, requested=4, partial=True, reason="missing", timing=timing(1500))), PAYLOADS
    yield "read-reply-empty", "ReadReply", READ_ID, wire.WireReadReply(
        done=v1.ReadDone(returned=0, requested=4, partial=True, reason="missing")), []
    yield "error", "Error", ERROR_ID, wire.WireError(
        code=8, message="memory tier full: no room for 337 bytes"), []  # RESOURCE_EXHAUSTED


def main():
    out = []
    for name, kind, rid, meta, payloads in frames():
        meta_bytes = meta.SerializeToString() if meta is not None else b""
        data = b"".join(payloads)
        raw = HEADER.pack(b"KVW1", KINDS[kind], 0, 0, rid, len(meta_bytes), len(data)) + meta_bytes + data
        out.append({
            "name": name,
            "kind": kind,
            "kind_byte": KINDS[kind],
            "request_id": rid,
            "meta_type": meta.DESCRIPTOR.full_name if meta is not None else None,
            "meta": json_format.MessageToDict(meta, preserving_proto_field_name=True) if meta is not None else None,
            "payloads_hex": [p.hex() for p in payloads],
            "frame_hex": raw.hex(),
        })
    doc = {
        "version": 1,
        "about": "Golden frames of the bulk data plane (docs/wire.md), generated once by tests/vectors/gen_wire.py "
                 "(struct + protobuf, not the implementations' framing code); checked byte for byte by "
                 "crates/kvtier-proto/tests/wire_vectors.rs and python/tests/test_wire_vectors.py. "
                 "meta is the metadata message in protobuf's JSON mapping (bytes as base64).",
        "frames": out,
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
