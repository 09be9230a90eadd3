"""The data plane's frame layout (docs/wire.md), for tests that speak it
themselves: peers that misbehave, uploads that stall. The SDK has no framing
code of its own: its data plane is the Rust client core (kvtier._native)."""
from __future__ import annotations

import struct

#: magic, kind, flags, reserved, request id, meta_len, data_len (little-endian).
HEADER = struct.Struct("<4sBBHQII")
MAGIC = b"KVW1"


class Kind:
    """Frame kinds."""

    READ = 1
    WRITE = 2
    HELLO = 3
    MAP_READ = 6
    RELEASE = 7
    LEND = 8
    WRITE_LENT = 9
    READ_REPLY = 0x81
    WRITE_REPLY = 0x82
    HELLO_REPLY = 0x83
    MAP_READ_REPLY = 0x86
    RELEASE_REPLY = 0x87
    LEND_REPLY = 0x88
    ERROR = 0xFF


def frame(kind: int, rid: int, meta: bytes, data: bytes = b"", magic: bytes = MAGIC) -> bytes:
    return HEADER.pack(magic, kind, 0, 0, rid, len(meta), len(data)) + meta + data
