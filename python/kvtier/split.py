"""Writes cut to the server's message limit on the gRPC path, as the native
core cuts its data-plane writes (``write_split`` in
crates/kvtier-client/src/wire/into.rs).

A server refuses a request larger than its ``server.max_message_size``
(advertised in ``Stats.max_message_size``; 256 MiB by default): an engine
step that saves more than that in one ``write`` (a 512 MiB step of 16 MiB
blocks) would store nothing. Without ``kvtier._native`` (Python < 3.11, a
checkout on ``PYTHONPATH``) :class:`kvtier.Client` writes over gRPC, so it
cuts such a batch into consecutive runs that each fit, with the same room
per block for its metadata and the same error for a block that alone is
too large, and sends them as the native core does: one after another (two
near the limit at once would not fit the server's ``server.request_memory``,
256 MiB by default, together), each stored whole or not at all, a failed one
failing the call. Reads need no cutting:
gRPC streams a read one block per message.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import grpc

from .errors import KvtierError
from .results import Block, ServerTiming

__all__ = ["DEFAULT_LIMIT", "BLOCK_OVERHEAD", "runs", "summed"]

#: The server's default ``server.max_message_size``, for a server that does
#: not say (the native core's ``DEFAULT_MAX_REQUEST``).
DEFAULT_LIMIT = 256 << 20
#: Room for each block's metadata besides its payload (as the native core).
BLOCK_OVERHEAD = 256


def _size(payload) -> int:
    if isinstance(payload, (list, tuple)):
        return sum(_size(p) for p in payload)
    return memoryview(payload).nbytes


def runs(blocks: Sequence[Block], limit: int) -> list[Sequence[Block]]:
    """``blocks`` as consecutive runs of at most ``limit`` bytes each
    (payloads plus :data:`BLOCK_OVERHEAD` per block); ``limit`` 0 means
    :data:`DEFAULT_LIMIT`. A block that alone is over the limit can never be
    stored: ``KvtierError(INVALID_ARGUMENT)`` before anything is sent."""
    limit = limit or DEFAULT_LIMIT
    sizes = [_size(b.payload) + BLOCK_OVERHEAD for b in blocks]
    for i, n in enumerate(sizes):
        if n > limit:
            raise KvtierError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"block {i} is {n - BLOCK_OVERHEAD} bytes, more than the server accepts in one request "
                f"({limit} bytes, its server.max_message_size)",
            )
    out: list[Sequence[Block]] = []
    start = 0
    while start < len(blocks):
        end, total = start, 0
        while end < len(blocks) and (end == start or total + sizes[end] <= limit):
            total += sizes[end]
            end += 1
        out.append(blocks[start:end])
        start = end
    return out


def summed(timings: Sequence[ServerTiming], elapsed_us: int) -> ServerTiming:
    """The server timings of a write's requests added up (the native core's
    ``add_timing``), with the call's own ``elapsed_us``."""
    total = {f.name: sum(getattr(t, f.name) for t in timings) for f in dataclasses.fields(ServerTiming)}
    total["elapsed_us"] = elapsed_us
    return ServerTiming(**total)
