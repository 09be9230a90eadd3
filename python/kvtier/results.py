"""The values the client's calls take and return: :class:`Block` goes in,
the ``*Result`` dataclasses come out (each with the server's
:class:`ServerTiming`), and the conversions from the ``kvtier.v1`` reply
messages into them.

Shared by the single-node client (:mod:`kvtier.node`) and the cluster client
(:mod:`kvtier.cluster`), which returns the same types with the nodes' answers
put together. No gRPC import: the messages are only read here.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

__all__ = [
    "Tier",
    "ServerTiming",
    "Block",
    "LookupResult",
    "TierCount",
    "ReadBlock",
    "ReadResult",
    "WriteResult",
    "DeleteResult",
    "LeaseResult",
    "TierStats",
    "StatsResult",
    "token_chain",
]

if TYPE_CHECKING:
    from typing_extensions import Buffer, TypeAlias

    #: What a :class:`Block` may carry: any bytes-like object, or a list or tuple of
    #: them that together form the payload (``Sequence`` because ``list`` is invariant).
    Payload: TypeAlias = Union[Buffer, Sequence[Buffer]]
    #: A :class:`ReadBlock`'s payload: ``bytes``, or with ``read(into=...)`` a view of
    #: the caller's buffer (a list of views for a scatter list).
    ReadPayload: TypeAlias = Union[bytes, memoryview, list[memoryview]]


class Tier(enum.IntEnum):
    """Storage tier a block was found in (``kvtier.v1.Tier``)."""

    UNSPECIFIED = 0
    MEMORY = 1
    DISK = 2
    OBJECT = 3
    PEER = 4
    """Another node of the cluster (docs/cluster.md)."""

    @classmethod
    def of(cls, v: int) -> Tier:
        try:
            return cls(v)
        except ValueError:
            return cls.UNSPECIFIED


@dataclass(frozen=True)
class ServerTiming:
    """The server's own timing of one request, in microseconds.

    ``elapsed_us`` is the client's end-to-end time of the same call (all
    attempts), so ``network_us = elapsed_us - total_us``. ``storage_peer_us``
    is time spent waiting on other nodes of a cluster (docs/cluster.md).
    """

    queue_us: int = 0
    service_us: int = 0
    storage_memory_us: int = 0
    storage_disk_us: int = 0
    storage_object_us: int = 0
    total_us: int = 0
    elapsed_us: int = 0
    # Last, so that positional construction keeps its meaning.
    storage_peer_us: int = 0

    @property
    def storage_us(self) -> int:
        return self.storage_memory_us + self.storage_disk_us + self.storage_object_us + self.storage_peer_us

    @property
    def network_us(self) -> int:
        """Client end-to-end minus server total (never negative)."""
        return max(0, self.elapsed_us - self.total_us)

    @classmethod
    def _from_pb(cls, t, elapsed_us: int = 0) -> ServerTiming:
        if t is None:
            return cls(elapsed_us=elapsed_us)
        return cls(
            queue_us=t.queue_us,
            service_us=t.service_us,
            storage_memory_us=t.storage_memory_us,
            storage_disk_us=t.storage_disk_us,
            storage_object_us=t.storage_object_us,
            total_us=t.total_us,
            elapsed_us=elapsed_us,
            storage_peer_us=t.storage_peer_us,
        )

    @classmethod
    def _of(cls, msg, elapsed_us: int = 0) -> ServerTiming:
        """The timing a reply message carries in its ``timing`` field, if set."""
        return cls._from_pb(msg.timing if msg.HasField("timing") else None, elapsed_us)


@dataclass(frozen=True)
class Block:
    """One block to write. The CRC32C is computed by :meth:`Client.write`.

    ``payload`` is any bytes-like object, or a list of them that together
    form the payload (gathered without a copy on the data plane: e.g. the K
    and V pages of a KV block that live apart in memory).
    """

    key: bytes
    payload: Payload
    parent: bytes | None = None
    token_count: int = 0
    ttl_ms: int = 0
    token_ids: Sequence[int] = ()
    """The block's token ids (none, or ``token_count`` of them): the
    server's KV events carry them so routers can match blocks to prompts
    (docs/events.md). The disk tier keeps them in its record, for the
    events after a restart; a read never returns them."""


@dataclass(frozen=True)
class LookupResult:
    found: int
    """Number of leading blocks present."""
    tiers: list[Tier]
    """Tier of each found block."""
    keys: list[bytes]
    """The keys checked (for token lookups: computed by the client, or by the server with ``hash_on_server``)."""
    lease_id: int
    """Non-zero when a lease was taken on the found prefix."""
    lease_expires_unix_ms: int
    timing: ServerTiming
    lease_node: str = ""
    """The node that granted the lease (:class:`~kvtier.ClusterClient` only;
    empty for a single address): give it with the lease id to a cluster
    client that did not take the lease (another process) to read or release it."""
    nodes: list[str] = field(default_factory=list)
    """The node holding each found block ("" = the object store)."""
    tier_counts: list[TierCount] = field(default_factory=list)
    """Per node and tier: blocks of the found prefix there, and how many of
    them lie in that node's leading run (docs/events.md, "Per-tier lookup")."""


@dataclass(frozen=True)
class TierCount:
    """One entry of :attr:`LookupResult.tier_counts`."""

    node: str
    """The node ("" = the object store)."""
    tier: Tier
    blocks: int
    """Blocks of the found prefix at this node and tier."""
    leading: int
    """Of those, the ones in the node's run from the first block."""


@dataclass(frozen=True)
class ReadBlock:
    index: int
    """Position in the request's key list."""
    key: bytes
    parent: bytes | None
    token_count: int
    payload: ReadPayload
    """Payload, checksum verified."""
    tier: Tier


@dataclass(frozen=True)
class ReadResult:
    blocks: list[ReadBlock]
    """Blocks in request order (a prefix of the request)."""
    requested: int
    partial: bool
    """True when fewer blocks than requested were returned."""
    reason: str
    """``missing``, ``deadline`` or empty."""
    timing: ServerTiming

    @property
    def payloads(self) -> list[ReadPayload]:
        return [b.payload for b in self.blocks]

    @classmethod
    def _of_done(cls, blocks: list[ReadBlock], requested: int, done, us: int) -> ReadResult:
        """A gRPC read's result from its closing ``ReadDone`` message."""
        if done is None:
            # The server always ends with ReadDone; be lenient but honest.
            return cls(blocks, requested, len(blocks) < requested, "", ServerTiming(elapsed_us=us))
        return cls(blocks, done.requested, done.partial, done.reason, ServerTiming._of(done, us))

    @classmethod
    def _of_native(cls, blocks: list[ReadBlock], requested: int, got: tuple[Any, ...], us: int) -> ReadResult:
        """A data-plane read's result from the native core's ``(blocks, partial, reason, timing)``."""
        _, partial, reason, timing = got
        return cls(blocks, requested, partial, reason, ServerTiming(elapsed_us=us, **timing))


@dataclass(frozen=True)
class WriteResult:
    stored: int
    """Blocks newly stored."""
    existing: int
    """Blocks already present (idempotent re-writes)."""
    timing: ServerTiming
    deferred: int = 0
    """Of those, blocks the server keeps in memory only until they are used
    again: its admission policy (``disk.admission``, ``object_store.admission``)
    defers their disk or object-store copy (docs/cache-choice.md)."""


@dataclass(frozen=True)
class DeleteResult:
    deleted: int
    timing: ServerTiming


@dataclass(frozen=True)
class LeaseResult:
    lease_id: int
    lease_expires_unix_ms: int
    timing: ServerTiming
    lease_node: str = ""
    """The node that granted the lease (:class:`~kvtier.ClusterClient` only), as in :class:`LookupResult`."""


@dataclass(frozen=True)
class TierStats:
    tier: Tier
    blocks: int
    bytes: int
    capacity_bytes: int
    hits: int
    misses: int
    evictions: int


@dataclass(frozen=True)
class StatsResult:
    tiers: list[TierStats]
    active_leases: int
    expired_blocks: int
    version: str
    timing: ServerTiming
    data_listen: str = ""
    """The data-plane address the server advertises (empty: none)."""
    local_listen: str = ""
    """The same-host socket's path the server advertises (empty: none; docs/local.md)."""
    max_message_size: int = 0
    """The largest request the server accepts (0: not said)."""
    instance_id: int = 0
    """Random at each server start: tells two servers apart."""

    def tier(self, tier: Tier) -> TierStats | None:
        return next((t for t in self.tiers if t.tier == tier), None)

    @classmethod
    def _of(cls, r, us: int) -> StatsResult:
        """From a ``kvtier.v1.StatsResponse``."""
        return cls(
            tiers=[
                TierStats(Tier.of(t.tier), t.blocks, t.bytes, t.capacity_bytes, t.hits, t.misses, t.evictions)
                for t in r.tiers
            ],
            active_leases=r.active_leases,
            expired_blocks=r.expired_blocks,
            version=r.version,
            timing=ServerTiming._of(r, us),
            data_listen=r.data_listen,
            local_listen=r.local_listen,
            max_message_size=r.max_message_size,
            instance_id=r.instance_id,
        )


def token_chain(keys: Sequence[bytes], payloads: Sequence[bytes], block_size: int, n_tokens: int,
                ttl_ms: int = 0) -> list[Block]:
    """One block per key of a token chain, each the child of the one before
    (``write_tokens``); ``ValueError`` unless there is one payload per key."""
    payloads = list(payloads)
    if len(payloads) != len(keys):
        raise ValueError(
            f"{len(payloads)} payloads for {len(keys)} full blocks of {block_size} tokens ({n_tokens} tokens)"
        )
    return [
        Block(key=k, payload=p, parent=keys[i - 1] if i else None, token_count=block_size, ttl_ms=ttl_ms)
        for i, (k, p) in enumerate(zip(keys, payloads))
    ]
