"""Payloads between the caller's buffers and the wire: their CRC32C, parts
joined into one message, and blocks read over gRPC copied into the buffers
the caller named (``read(into=...)``, ``read_into``).

The data plane needs none of this: the native core (:mod:`kvtier.dataplane`)
checksums, gathers and scatters the caller's buffers itself. These are the
gRPC path's equivalents, so both paths give the same results and errors.
"""
from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any, Callable

import grpc

from ._crc import crc32c
from .errors import KvtierError
from .results import Block, ReadBlock, Tier

__all__ = ["joined", "crc_of", "fill", "destinations", "capacity", "copy_into", "native_block", "pb_blocks", "read_block"]


def joined(payload) -> bytes:
    """A payload as one ``bytes`` (parts concatenated)."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, (list, tuple)):
        return b"".join(bytes(p) for p in payload)
    return bytes(payload)


def crc_of(payload) -> int:
    """CRC32C of a payload given as one buffer or as consecutive parts."""
    if isinstance(payload, (list, tuple)):
        c = 0
        for p in payload:
            c = crc32c(p, c)
        return c
    return crc32c(payload)


def fill(view_or_parts, payload) -> memoryview | list[memoryview]:
    """Copies ``payload`` into one writable buffer or consecutive parts; returns
    what was filled. ``ValueError`` when they cannot take it."""
    if isinstance(view_or_parts, (list, tuple)):
        parts: list[memoryview] = []
        pos = 0
        src = memoryview(payload).cast("B")
        for p in view_or_parts:
            v = memoryview(p).cast("B")
            k = min(v.nbytes, src.nbytes - pos)
            v[:k] = src[pos:pos + k]
            parts.append(v[:k])
            pos += k
        if pos < src.nbytes:
            raise ValueError(f"buffers hold {pos} bytes, need {src.nbytes}")
        return parts
    view = memoryview(view_or_parts).cast("B")
    n = len(payload)
    if view.nbytes < n or view.readonly:
        raise ValueError(f"buffer holds {view.nbytes} bytes, need {n}")
    view[:n] = payload
    return view[:n]


def filled(view_or_parts, n: int) -> memoryview | list[memoryview]:
    """The first ``n`` bytes of one buffer or of consecutive parts, which
    something else (the native core, the server) has filled."""
    if isinstance(view_or_parts, (list, tuple)):
        parts: list[memoryview] = []
        for p in view_or_parts:
            v = memoryview(p).cast("B")
            k = min(v.nbytes, n)
            parts.append(v[:k])
            n -= k
        return parts
    return memoryview(view_or_parts).cast("B")[:n]


def destinations(into: Callable[[int, int], object], sizes: int | Sequence[int], n: int) -> list[Any]:
    """``read(into=..., sizes=...)``: the destination of each of ``n`` keys,
    asked of ``into`` up front with its known size (``None``: a new
    ``bytearray`` of that size), for one :meth:`~kvtier.node.NodeClient.read_into`."""
    per = [sizes] * n if isinstance(sizes, int) else list(sizes)
    if len(per) != n:
        raise ValueError(f"{n} keys but {len(per)} sizes")
    out: list[Any] = []
    for i, size in enumerate(per):
        size = operator.index(size)
        if size < 0:
            raise ValueError(f"size of block {i} is {size}, not a byte count")
        buf = into(i, size)
        out.append(bytearray(size) if buf is None else buf)
    return out


def capacity(view_or_parts) -> int:
    """Bytes one buffer, or a list of consecutive parts, can take."""
    if isinstance(view_or_parts, (list, tuple)):
        return sum(memoryview(p).nbytes for p in view_or_parts)
    return memoryview(view_or_parts).nbytes


def copy_into(b: ReadBlock, into: Callable[[int, int], object]) -> ReadBlock:
    """``read(into=...)``: the payload copied into the caller's buffer. A
    buffer that cannot take it is the caller's mistake: INVALID_ARGUMENT,
    not retried."""
    buf = into(b.index, len(b.payload))
    if buf is None:
        return b
    try:
        filled = fill(buf, b.payload)
    except ValueError as e:
        raise KvtierError(grpc.StatusCode.INVALID_ARGUMENT, f"buffer for block {b.index}: {e}") from None
    return ReadBlock(b.index, b.key, b.parent, b.token_count, filled, b.tier)


def native_block(b: Block) -> tuple[bytes, bytes | None, int, Any, int, list[int]]:
    """A block as the native core takes it; a payload given as parts is joined (copied)."""
    if not isinstance(b, Block):
        raise TypeError(f"expected kvtier.Block, got {type(b).__name__}")
    payload = joined(b.payload) if isinstance(b.payload, (list, tuple)) else b.payload
    return (bytes(b.key), bytes(b.parent) if b.parent else None, b.token_count, payload, b.ttl_ms,
            list(b.token_ids))


def pb_blocks(v1: Any, blocks: Iterable[Block]) -> list[Any]:
    """``kvtier.v1.Block`` messages (``v1``: the generated module) with checksums computed here."""
    out = []
    for b in blocks:
        if not isinstance(b, Block):
            raise TypeError(f"expected kvtier.Block, got {type(b).__name__}")
        payload = joined(b.payload)
        out.append(
            v1.Block(
                key=bytes(b.key),
                parent_key=bytes(b.parent) if b.parent else b"",
                token_count=b.token_count,
                crc32c=crc_of(payload),
                payload=payload,
                ttl_ms=b.ttl_ms,
                token_ids=list(b.token_ids),
            )
        )
    return out


def read_block(rb: Any) -> ReadBlock:
    """A ``kvtier.v1.ReadBlock`` message as a :class:`ReadBlock`, its checksum
    verified (``KvtierError(DATA_LOSS)`` on a mismatch)."""
    if not rb.HasField("block"):
        raise KvtierError(grpc.StatusCode.INTERNAL, "server sent a ReadBlock without a block")
    b = rb.block
    actual = crc_of(b.payload)
    if actual != b.crc32c:
        raise KvtierError(
            grpc.StatusCode.DATA_LOSS,
            f"block {b.key.hex()} arrived with crc32c {actual:#010x}, expected {b.crc32c:#010x}",
        )
    return ReadBlock(
        index=rb.index,
        key=b.key,
        parent=b.parent_key or None,
        token_count=b.token_count,
        payload=b.payload,
        tier=Tier.of(rb.tier),
    )
