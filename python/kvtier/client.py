"""Synchronous Python client for ``kvtier.v1`` (mirrors crates/kvtier-client).

* A pool of N gRPC channels (separate HTTP/2 connections: one TCP stream caps
  throughput), used round-robin.
* A deadline on every call (``timeout`` seconds, covering retries).
* Retries of idempotent calls (all kvtier.v1 calls are) on ``UNAVAILABLE``
  with exponential backoff and jitter, within the deadline.
* End-to-end checksums: CRC32C computed on write, verified on read.
* ``read`` / ``write`` over the server's same-host socket (``docs/local.md``:
  blocks copied straight into the caller's buffers) or bulk data plane
  (``docs/wire.md``) when it advertises one, by the Rust client core
  (:mod:`kvtier.dataplane`); gRPC otherwise. The transport in use is logged once.
* The key scheme, so callers can pass tokens instead of keys.

>>> from kvtier import Client
>>> with Client("127.0.0.1:50051") as c:                     # doctest: +SKIP
...     c.write_tokens("my-model", tokens, payloads)
...     print(c.lookup("my-model", tokens=tokens).found)
"""
from __future__ import annotations

import enum
import itertools
import logging
import os
import random
import ssl
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar, Union

import grpc

from . import dataplane as _dp
from . import keys as _keys
from ._crc import crc32c
from ._proto import load as _load_proto
from .errors import KvtierError

_log = logging.getLogger("kvtier")

__all__ = [
    "Client",
    "KvtierError",
    "Tier",
    "ServerTiming",
    "Block",
    "LookupResult",
    "ReadBlock",
    "ReadResult",
    "WriteResult",
    "DeleteResult",
    "LeaseResult",
    "TierStats",
    "StatsResult",
    "MAX_MESSAGE_SIZE",
]

#: Largest gRPC message sent or received (matches the Rust client).
MAX_MESSAGE_SIZE = 512 << 20

#: The fields of ``kvtier.v1.ServerTiming`` (and of :class:`ServerTiming`, less ``elapsed_us``).
_TIMING_FIELDS = ("queue_us", "service_us", "storage_memory_us", "storage_disk_us", "storage_object_us",
                  "storage_peer_us", "total_us")

T = TypeVar("T")

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


@dataclass(frozen=True)
class WriteResult:
    stored: int
    """Blocks newly stored."""
    existing: int
    """Blocks already present (idempotent re-writes)."""
    timing: ServerTiming


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


def _local_path(t: str) -> str | None:
    """The socket path of a ``unix:///path`` (or ``unix:/path``) target."""
    for scheme in ("unix://", "unix:"):
        if t.startswith(scheme):
            return t[len(scheme):]
    return None


def _target(t: str) -> str:
    local = _local_path(t)
    if local is not None:
        return f"unix:{local}"
    for scheme in ("http://", "grpc://", "https://"):
        if t.startswith(scheme):
            t = t[len(scheme):]
    return t.rstrip("/")


def _check_keys(keys: Sequence[bytes]) -> list[bytes]:
    if isinstance(keys, (bytes, bytearray, str)):
        raise TypeError("keys must be a sequence of bytes, not a single key")
    out = []
    for k in keys:
        if not isinstance(k, (bytes, bytearray, memoryview)):
            raise TypeError(f"key {k!r} is not bytes")
        out.append(bytes(k))
    return out


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


class Client:
    """A pooled, thread-safe ``kvtier.v1`` client.

    :param target: ``host:port`` (an ``http://`` prefix is accepted). A list
        of addresses, or one string of comma-separated addresses, is a
        cluster: ``Client(...)`` then returns a :class:`kvtier.cluster.ClusterClient`
        (one ``Client`` per node, built with the other arguments, plus
        ``replicas=``; docs/cluster.md).
    :param connections: gRPC channels (HTTP/2 connections) in the pool.
    :param timeout: deadline per call in seconds, retries included.
    :param block_size: tokens per block for keys computed from tokens.
    :param hash: hash function for keys computed from tokens.
    :param retries: retries after the first attempt on ``UNAVAILABLE``; a
        request the server shed is retried no sooner than the retry hint it
        sent (jittered over [hint, 1.5 × hint]), and not at all when that
        pause does not fit the deadline.
    :param retry_shed: ``False``: a request the server shed with a retry
        hint fails at once (``KvtierError`` UNAVAILABLE, its ``retry_after``
        set) instead of waiting for the hint; other ``UNAVAILABLE`` errors
        (a restart, a connection lost) are still retried. For callers that
        would rather do without kvtier than wait: an engine recomputes a
        prefix it cannot load.
    :param data_plane: send ``read`` / ``write`` over the server's bulk data
        plane when it advertises one (found with one ``Stats`` call on first
        use); ``False`` keeps everything on gRPC.
    :param data_connections: data-plane connections (at most one request in
        flight on each); 0 means as many as ``connections``.
    :param read_stripes: most data-plane connections one long read is
        striped over (default :data:`kvtier.dataplane.MAX_STRIPES`, 8; 1: never
        stripe). A read is split into contiguous runs of at least
        :data:`kvtier.dataplane.STRIPE_MIN_BLOCKS` (8) keys, so from 16 keys on,
        and never over more connections than ``data_connections`` allows;
        the runs are read at once, and the answer is still one prefix in key
        order (:meth:`read`, docs/wire.md). The Rust client's
        ``ClientConfig::read_stripes``; reads over gRPC are not striped.
    :param data_tcp_congestion: TCP congestion control of data-plane
        connections (``None`` or ``""``: the system default), as in the Rust client.
    :param token: bearer token for a server with authentication on
        (``authorization: Bearer TOKEN`` on every gRPC call, a Hello frame on
        every data-plane connection; docs/security.md). Default: ``$KVTIER_TOKEN``.
    :param tls_ca: PEM CA bundle (a path): connect over TLS (gRPC and the data
        plane), verifying the server against it. Default: ``$KVTIER_TLS_CA``.
    :param tls_cert: PEM client certificate (a path) for servers that verify
        clients, with ``tls_key``. Defaults: ``$KVTIER_TLS_CERT``, ``$KVTIER_TLS_KEY``.
    :param tls_server_name: the name the server's certificate carries, when
        it is not the host of ``target``.
    :param same_host: move reads and writes to the server's same-host socket
        when it advertises one that exists here and leads back to it
        (docs/local.md); ``False`` stays on the TCP data plane.
    :param salt: secret salt for keys computed from tokens (docs/keys.md): a
        tenant's keys then cannot be computed, so not pre-written, by anyone
        without it. Never sent to the server. Default: ``$KVTIER_KEY_SALT``.
    """

    def __new__(cls, target: str | Sequence[str] = "127.0.0.1:50051", *args: Any, **kwargs: Any) -> Any:
        # A cluster is a thin layer over one Client per node (kvtier.cluster);
        # it is not a Client, so Python does not run __init__ on it.
        if cls is Client and (not isinstance(target, str) or "," in target):
            from .cluster import ClusterClient

            return ClusterClient(target, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        target: str | Sequence[str] = "127.0.0.1:50051",
        connections: int = 4,
        timeout: float = 10.0,
        block_size: int = _keys.DEFAULT_BLOCK_SIZE,
        hash: str = _keys.DEFAULT_HASH,
        retries: int = 2,
        data_plane: bool = True,
        data_connections: int = 0,
        data_tcp_congestion: str | None = None,
        token: str | None = None,
        salt: bytes | str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_server_name: str | None = None,
        read_stripes: int = _dp.MAX_STRIPES,
        retry_shed: bool = True,
        same_host: bool = True,
    ):
        _keys.check_block_size(block_size)
        _keys.key_len(hash)  # validates the name
        if connections < 1:
            raise ValueError("connections must be >= 1")
        if data_connections < 0:
            raise ValueError("data_connections must be >= 0")
        if read_stripes < 1:
            raise ValueError("read_stripes must be >= 1")
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        if not isinstance(target, str):  # only a subclass gets here with a list
            raise TypeError(f"{type(self).__name__} takes one address, not {type(target).__name__}")
        self.target = _target(target)
        self._local = _local_path(target)
        self.timeout = float(timeout)
        self.block_size = block_size
        self.hash = hash
        if salt is None:
            salt = os.environ.get("KVTIER_KEY_SALT", "")
        self._salt = salt.encode() if isinstance(salt, str) else bytes(salt)
        self.retries = retries
        self.retry_shed = retry_shed
        self._pb = _load_proto()
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
            # Without this, channels with equal arguments share one subchannel
            # (one TCP connection) through the global subchannel pool.
            ("grpc.use_local_subchannel_pool", 1),
            # Retries are done here, with our own deadline accounting.
            ("grpc.enable_retries", 0),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            # gRPC's default reconnect back-off grows to 120 s: a restarted
            # server would stay unused for up to two minutes.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2_000),
        ]
        if self._local is not None:
            # grpcio would send the socket's path as :authority, which HTTP/2
            # servers refuse.
            options.append(("grpc.default_authority", "localhost"))
        if token is None:
            token = os.environ.get("KVTIER_TOKEN") or None
        self._token = token
        tls_ca = tls_ca if tls_ca is not None else os.environ.get("KVTIER_TLS_CA") or None
        tls_cert = tls_cert if tls_cert is not None else os.environ.get("KVTIER_TLS_CERT") or None
        tls_key = tls_key if tls_key is not None else os.environ.get("KVTIER_TLS_KEY") or None
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        # TLS with tls_ca, or with the system's roots for an https:// target.
        want_tls = bool(tls_ca) or target.startswith("https://")
        if tls_cert and not want_tls:
            raise ValueError("a client certificate needs tls_ca (TLS is off without it)")
        self._tls: ssl.SSLContext | None = None
        self._tls_pems: tuple[bytes | None, bytes | None, bytes | None] | None = None
        self._tls_name = tls_server_name or self.target.rsplit(":", 1)[0].strip("[]")
        if want_tls and self._local is not None:
            raise ValueError("TLS is not used on the same-host socket (unix://): drop the TLS settings")
        if want_tls:
            ca_pem = None
            if tls_ca:
                with open(tls_ca, "rb") as f:
                    ca_pem = f.read()
            cert_pem = key_pem = None
            if tls_cert:
                assert tls_key is not None  # they go together (checked above)
                with open(tls_cert, "rb") as f:
                    cert_pem = f.read()
                with open(tls_key, "rb") as f:
                    key_pem = f.read()
            creds = grpc.ssl_channel_credentials(
                root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
            )
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channels = [grpc.secure_channel(self.target, creds, options=options) for _ in range(connections)]
            self._tls = ssl.create_default_context(cafile=tls_ca or None)
            if tls_cert:
                self._tls.load_cert_chain(tls_cert, tls_key)
            self._tls_pems = (ca_pem, cert_pem, key_pem)
        else:
            self._channels = [grpc.insecure_channel(self.target, options=options) for _ in range(connections)]
        if token:
            auth = _BearerInterceptor(token)
            self._channels = [grpc.intercept_channel(ch, auth) for ch in self._channels]
        self._stubs = [self._pb.v1_grpc.KvTierStub(ch) for ch in self._channels]
        self._next = itertools.count()
        self._rr_lock = threading.Lock()
        self._closed = False
        self._data_plane = bool(data_plane)
        self._data_connections = data_connections or connections
        self._data_tcp_congestion = data_tcp_congestion or None
        self._read_stripes = read_stripes
        self._same_host = same_host
        self._wire: _dp.DataPlane | None = None
        self._wire_known = not self._data_plane  # True once discovery has run
        self._wire_lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------

    @property
    def pb(self):
        """The generated messages of ``kvtier.v1`` (``client.pb.WriteRequest`` ...)."""
        return self._pb.v1

    @property
    def connections(self) -> int:
        return len(self._channels)

    def stub(self):
        """The next raw ``KvTierStub`` of the pool (round-robin), for calls this API does not wrap."""
        if self._closed:
            raise ValueError("client is closed")
        with self._rr_lock:
            i = next(self._next) % len(self._stubs)
        return self._stubs[i]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for ch in self._channels:
                ch.close()
            if self._wire is not None:
                self._wire.close()

    def data_plane(self) -> _dp.DataPlane | None:
        """The data plane ``read`` / ``write`` use, or ``None`` when they use gRPC.

        The first call asks the server (``Stats``) and connects, choosing as
        the Rust client does: the same-host socket when the target is
        ``unix://PATH``, or when the server advertises one that exists here
        and leads back to the same server (``Stats.instance_id``); else the
        TCP data plane (``Stats.data_listen``); else gRPC. The choice is
        logged once. Errors of that call, and a data plane that refuses the
        token, propagate and discovery is tried again next time. An
        advertised data plane that cannot be reached (a container that
        publishes only the gRPC port, say) is logged and this client uses
        gRPC from then on; so does a Python without ``kvtier._native``.
        """
        if self._wire_known:
            return self._wire
        with self._wire_lock:
            if not self._wire_known:
                self._wire = self._discover()
                self._wire_known = True
        return self._wire

    def _discover(self) -> _dp.DataPlane | None:
        if not _dp.available():
            _log.warning("kvtier transport: gRPC for reads and writes of %s (%s)", self.target, _dp.why_unavailable())
            return None
        st = self.stats()
        common = dict(
            connections=self._data_connections, timeout=self.timeout, token=self._token,
            max_stripes=self._read_stripes, max_request=st.max_message_size,
        )
        if self._local is not None:
            pool: _dp.DataPlane | None = _dp.DataPlane(f"unix://{self._local}", **common)
            _log.info("kvtier transport: same-host socket %s (given), payloads copied by memory", self._local)
            return pool
        if self._same_host and st.local_listen and os.path.exists(st.local_listen):
            upgraded = self._upgrade(st, common)
            if upgraded is not None:
                return upgraded
        if not st.data_listen:
            _log.info("kvtier transport: gRPC (%s offers no data plane)", self.target)
            return None
        host, port = _data_plane_addr(self.target, st.data_listen)
        tls: dict[str, Any] = {}
        if self._tls_pems is not None:
            ca, cert, key = self._tls_pems
            tls = dict(tls_ca=ca or b"", tls_cert=cert, tls_key=key, tls_server_name=self._tls_name)
        try:
            pool = _dp.DataPlane(f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                                 congestion=self._data_tcp_congestion, **common, **tls)
        except KvtierError as e:
            if e.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            _log.warning(
                "kvtier transport: gRPC (the data plane %s:%s advertised by %s cannot be reached: %s)",
                host, port, self.target, e,
            )
            return None
        _log.info("kvtier transport: TCP data plane %s:%s (advertised by %s)", host, port, self.target)
        return pool

    def _upgrade(self, st: StatsResult, common: dict[str, Any]) -> _dp.DataPlane | None:
        """The advertised same-host socket, if it leads back to this server
        (a socket at that path on this host may be another kvtier's)."""
        path = st.local_listen
        try:
            with grpc.insecure_channel(f"unix:{path}", options=[("grpc.default_authority", "localhost")]) as ch:
                md = [("authorization", f"Bearer {self._token}")] if self._token else None
                there = self._pb.v1_grpc.KvTierStub(ch).Stats(self._pb.v1.StatsRequest(), timeout=self.timeout,
                                                              metadata=md)
            if there.instance_id != st.instance_id or not st.instance_id:
                _log.debug("kvtier: the socket %s is another server's", path)
                return None
            pool = _dp.DataPlane(f"unix://{path}", **common)
        except (grpc.RpcError, KvtierError) as e:
            _log.debug("kvtier: the same-host socket %s is not usable from here: %s", path, e)
            return None
        _log.info("kvtier transport: same-host socket %s (advertised by %s), payloads copied by memory",
                  path, self.target)
        return pool

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.target!r}, connections={len(self._channels)}, timeout={self.timeout})"

    def _backoff(self, attempt: int) -> float:
        base = 0.020 * (1 << min(attempt, 6))
        return base / 2 + random.uniform(0, base / 2)

    def _call(self, fn: Callable[[Any, float], T], timeout: float | None = None) -> tuple[T, int]:
        """Runs ``fn(stub, remaining_seconds)`` with retries on UNAVAILABLE (``stub``: a
        ``KvTierStub``, generated and loaded at run time, hence ``Any``).

        Returns the result and the end-to-end time in microseconds.
        """
        return self._retrying(lambda remaining: fn(self.stub(), remaining), timeout)

    def _retrying(self, fn: Callable[[float], T], timeout: float | None = None) -> tuple[T, int]:
        """Runs ``fn(remaining_seconds)``, retrying ``UNAVAILABLE`` (gRPC or data plane) within
        the deadline (``timeout`` seconds, default the client's)."""
        budget = self.timeout if timeout is None else float(timeout)
        if budget <= 0:
            raise ValueError("timeout must be > 0")
        start = time.monotonic()
        deadline = start + budget
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KvtierError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {budget}s")
            try:
                r = fn(remaining)
                return r, int((time.monotonic() - start) * 1e6)
            except grpc.RpcError as e:
                err = KvtierError.from_rpc(e)  # keeps e as its __cause__
            except KvtierError as e:
                err = e
            if err.code == grpc.StatusCode.UNAVAILABLE and attempt < self.retries:
                # The server's hint when it gave one (it knows when its limit
                # will have moved), jittered above it so the clients it shed
                # together do not come back together.
                hint = err.retry_after
                if hint is not None and not self.retry_shed:
                    raise err
                pause = hint * random.uniform(1.0, 1.5) if hint is not None else self._backoff(attempt)
                if time.monotonic() + pause < deadline:
                    time.sleep(pause)
                    attempt += 1
                    continue
            raise err

    # -- keys -------------------------------------------------------------

    def keys_for(self, tokens: Sequence[int]) -> list[bytes]:
        """Keys of the full blocks of ``tokens`` under this client's scheme."""
        return _keys.chain(tokens, self.block_size, self.hash, salt=self._salt)

    # -- calls ------------------------------------------------------------

    def lookup(
        self,
        namespace: str,
        keys: Sequence[bytes] | None = None,
        tokens: Sequence[int] | None = None,
        lease_ms: int = 0,
        hash_on_server: bool = False,
        timeout: float | None = None,
    ) -> LookupResult:
        """How many leading blocks are stored, given either ``keys`` or ``tokens``.

        With ``tokens`` the keys are computed here (only full blocks count);
        ``hash_on_server=True`` sends the tokens instead and lets the server hash
        them (with this client's block size and hash), returning its keys.
        ``lease_ms > 0`` pins the found prefix; the result carries the lease id.
        ``timeout`` (seconds) overrides the client's deadline for this call.
        """
        if (keys is None) == (tokens is None):
            raise ValueError("give exactly one of keys or tokens")
        pb = self._pb.v1
        if tokens is not None and hash_on_server:
            if self._salt:
                raise ValueError("hash_on_server would send the tokens unsalted; this client has a salt")
            toks = list(tokens)
            req = pb.LookupRequest(
                namespace=namespace, tokens=toks, block_size=self.block_size, hash=self.hash, lease_ms=lease_ms
            )
            checked: list[bytes] | None = None
        else:
            if tokens is not None:
                checked = self.keys_for(tokens)
            else:
                assert keys is not None  # exactly one of keys and tokens (checked above)
                checked = _check_keys(keys)
            req = pb.LookupRequest(namespace=namespace, keys=checked, lease_ms=lease_ms)
        r, us = self._call(lambda s, t: s.Lookup(req, timeout=t), timeout)
        return LookupResult(
            found=r.found_blocks,
            tiers=[Tier.of(t) for t in r.tiers],
            keys=checked if checked is not None else list(r.keys),
            lease_id=r.lease_id,
            lease_expires_unix_ms=r.lease_expires_unix_ms,
            timing=ServerTiming._of(r, us),
        )

    def read(
        self,
        namespace: str,
        keys: Sequence[bytes],
        lease_id: int = 0,
        timeout: float | None = None,
        into: Callable[[int, int], object] | None = None,
    ) -> ReadResult:
        """Reads ``keys`` in order; the server stops at the first missing block.

        Each payload's CRC32C is verified; a mismatch raises ``KvtierError(DATA_LOSS)``.
        ``timeout`` (seconds) overrides the client's deadline for this call.

        ``into(index, nbytes)`` lets the caller provide the destination of
        block ``index`` (its position in ``keys``): a writable buffer of at
        least ``nbytes``, a list of writable buffers filled one after the
        other (scatter), or ``None`` for a new ``bytes``. Over the data plane
        the payload is received straight into them; the block's ``payload``
        is then a memoryview of the filled bytes (a list of them for a
        scatter list), checksum verified. A retried call may write into the
        same buffers again.

        Over the data plane a read of 16 keys or more is striped
        (``read_stripes``, at most ``data_connections``): contiguous runs of
        keys are read at once on separate connections, and joined in key
        order up to the first run that stopped short (a missing block, the
        deadline), whose reason the result carries, exactly as one request
        would answer. An error in any run fails the whole read (and
        ``UNAVAILABLE`` retries all of it).

        ``into`` is called once the blocks have arrived, and each payload is
        copied into its buffer: :meth:`read_into`, which names the buffers
        up front, has them filled directly (by the server itself on the
        same-host socket) and is the fast path.
        """
        ks = _check_keys(keys)
        pool = self.data_plane()
        if pool is not None:
            got, us = self._retrying(lambda t: pool.read(namespace, ks, lease_id, t), timeout)
            blocks = [ReadBlock(i, k, p, n, payload, Tier.of(tier)) for i, k, p, n, payload, tier in got[0]]
            if into is not None:
                blocks = [_copy_into(b, into) for b in blocks]
            return self._native_result(blocks, ks, got, us)
        req = self._pb.v1.ReadRequest(namespace=namespace, keys=ks, lease_id=lease_id)

        def attempt(stub, t):
            blocks: list[ReadBlock] = []
            done = None
            for msg in stub.Read(req, timeout=t):
                which = msg.WhichOneof("item")
                if which == "block":
                    blocks.append(self._to_read_block(msg.block))
                elif which == "done":
                    done = msg.done
            return blocks, done

        (blocks, done), us = self._call(attempt, timeout)
        if into is not None:
            blocks = [_copy_into(b, into) for b in blocks]
        return self._read_result(blocks, ks, done, us)

    def read_into(
        self,
        namespace: str,
        keys: Sequence[bytes],
        buffers: Sequence[Any],
        lease_id: int = 0,
        timeout: float | None = None,
    ) -> ReadResult:
        """Reads ``keys`` in order into ``buffers``, one writable C-contiguous
        buffer per key (``bytearray``, ``memoryview``, a numpy array, a torch
        tensor's ``.numpy()`` view), each at least its block's size; stops at
        the first missing block.

        Each block's ``payload`` is a memoryview of the filled bytes of its
        buffer. On the same-host socket the server copies the blocks into the
        buffers itself (one copy, no bytes through the socket; docs/local.md);
        over the TCP data plane they are received straight into them, each
        checksum verified; over gRPC they are copied in. A buffer too small
        for its block raises ``KvtierError(INVALID_ARGUMENT)``; one that is
        read-only or not contiguous, ``ValueError``. After an error
        the buffers' contents are unspecified; a retried call fills them again.
        """
        ks = _check_keys(keys)
        if len(buffers) != len(ks):
            raise ValueError(f"{len(ks)} keys but {len(buffers)} buffers")
        pool = self.data_plane()
        if pool is None:
            r = self.read(namespace, ks, lease_id, timeout)
            blocks = []
            for b in r.blocks:
                try:
                    filled = _fill(buffers[b.index], b.payload)
                except ValueError as e:
                    raise KvtierError(grpc.StatusCode.INVALID_ARGUMENT, f"buffer {b.index}: {e}") from None
                blocks.append(ReadBlock(b.index, b.key, b.parent, b.token_count, filled, b.tier))
            return ReadResult(blocks, r.requested, r.partial, r.reason, r.timing)
        got, us = self._retrying(lambda t: pool.read_into(namespace, ks, lease_id, buffers, t), timeout)
        blocks = [
            ReadBlock(i, k, p, n, memoryview(buffers[i]).cast("B")[:length], Tier.of(tier))
            for i, k, p, n, length, tier in got[0]
        ]
        return self._native_result(blocks, ks, got, us)

    @staticmethod
    def _native_result(blocks: list[ReadBlock], ks: list[bytes], got, us: int) -> ReadResult:
        _, partial, reason, timing = got
        return ReadResult(blocks, len(ks), partial, reason, ServerTiming(elapsed_us=us, **timing))

    @staticmethod
    def _read_result(blocks: list[ReadBlock], ks: list[bytes], done, us: int) -> ReadResult:
        if done is None:
            # The server always ends with ReadDone; be lenient but honest.
            return ReadResult(blocks, len(ks), len(blocks) < len(ks), "", ServerTiming(elapsed_us=us))
        return ReadResult(
            blocks=blocks,
            requested=done.requested,
            partial=done.partial,
            reason=done.reason,
            timing=ServerTiming._of(done, us),
        )

    @staticmethod
    def _to_read_block(rb, payload: ReadPayload | None = None) -> ReadBlock:
        """A verified :class:`ReadBlock`; ``payload`` replaces the message's (data plane)."""
        if not rb.HasField("block"):
            raise KvtierError(grpc.StatusCode.INTERNAL, "server sent a ReadBlock without a block")
        b = rb.block
        if payload is None:
            payload = b.payload
        actual = _crc_of(payload)
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
            payload=payload,
            tier=Tier.of(rb.tier),
        )

    def _pb_blocks(self, blocks: Iterable[Block], payloads: list | None = None) -> list:
        """Protobuf blocks with checksums computed here. With ``payloads`` (a
        list to fill) the payloads are collected there and left out of the
        messages (data plane)."""
        pb = self._pb.v1
        out = []
        for b in blocks:
            if not isinstance(b, Block):
                raise TypeError(f"expected kvtier.Block, got {type(b).__name__}")
            if payloads is not None:
                # Data plane: the caller's buffers go to sendmsg as they are.
                payload = _as_parts(b.payload)
                payloads.append(payload)
            else:
                payload = _joined(b.payload)
            out.append(
                pb.Block(
                    key=bytes(b.key),
                    parent_key=bytes(b.parent) if b.parent else b"",
                    token_count=b.token_count,
                    crc32c=_crc_of(payload),
                    payload=b"" if payloads is not None else payload,
                    ttl_ms=b.ttl_ms,
                )
            )
        return out

    def write(self, namespace: str, blocks: Iterable[Block], timeout: float | None = None) -> WriteResult:
        """Stores a batch of blocks in one request (checksums computed here).

        The server verifies every block before storing any of them. Payloads
        may be any bytes-like object (``bytes``, ``memoryview``, a tensor's
        buffer); over the data plane they are sent without a copy.
        ``timeout`` (seconds) overrides the client's deadline for this call.
        """
        pool = self.data_plane()
        if pool is not None:
            # Checksums are computed by the native core, payloads passed as they are.
            items = [_native_block(b) for b in blocks]
            (stored, existing, timing), us = self._retrying(lambda t: pool.write(namespace, items, t), timeout)
            return WriteResult(stored, existing, ServerTiming(elapsed_us=us, **timing))
        else:
            req = self._pb.v1.WriteRequest(namespace=namespace, blocks=self._pb_blocks(blocks))
            r, us = self._call(lambda s, t: s.Write(req, timeout=t), timeout)
        return WriteResult(r.stored, r.existing, ServerTiming._of(r, us))

    def write_stream(self, namespace: str, blocks: Iterable[Block], batch_bytes: int = 16 << 20) -> WriteResult:
        """Stores blocks as a client stream of batches of about ``batch_bytes`` each.

        For writes too large for one message. Unlike :meth:`write`, batches
        already sent are stored even if a later one fails.
        """
        pbs = self._pb_blocks(blocks)
        batches: list[list] = [[]]
        size = 0
        for b in pbs:
            if batches[-1] and size + len(b.payload) > batch_bytes:
                batches.append([])
                size = 0
            batches[-1].append(b)
            size += len(b.payload)
        WriteRequest = self._pb.v1.WriteRequest

        def reqs():
            for batch in batches:
                yield WriteRequest(namespace=namespace, blocks=batch)

        r, us = self._call(lambda s, t: s.WriteStream(reqs(), timeout=t))
        return WriteResult(r.stored, r.existing, ServerTiming._of(r, us))

    def write_tokens(
        self, namespace: str, tokens: Sequence[int], payloads: Sequence[bytes], ttl_ms: int = 0
    ) -> WriteResult:
        """Writes one payload per full block of ``tokens``, chained parent to child."""
        return self.write(namespace, token_chain(self.keys_for(tokens), payloads, self.block_size, len(tokens),
                                                 ttl_ms))

    def delete(self, namespace: str, keys: Sequence[bytes], timeout: float | None = None) -> DeleteResult:
        """Deletes blocks (and their descendants)."""
        req = self._pb.v1.DeleteRequest(namespace=namespace, keys=_check_keys(keys))
        r, us = self._call(lambda s, t: s.Delete(req, timeout=t), timeout)
        return DeleteResult(r.deleted, ServerTiming._of(r, us))

    def lease(self, namespace: str, keys: Sequence[bytes], lease_ms: int) -> LeaseResult:
        """Pins explicit keys against eviction for ``lease_ms``."""
        req = self._pb.v1.LeaseRequest(namespace=namespace, keys=_check_keys(keys), lease_ms=lease_ms)
        r, us = self._call(lambda s, t: s.Lease(req, timeout=t))
        return LeaseResult(
            r.lease_id, r.lease_expires_unix_ms, ServerTiming._of(r, us)
        )

    def release(self, lease_id: int, timeout: float | None = None) -> LeaseResult:
        """Ends a lease early."""
        if lease_id == 0:
            raise ValueError("lease id 0 is not a lease")
        req = self._pb.v1.LeaseRequest(release_lease_id=lease_id)
        r, us = self._call(lambda s, t: s.Lease(req, timeout=t), timeout)
        return LeaseResult(
            r.lease_id, r.lease_expires_unix_ms, ServerTiming._of(r, us)
        )

    def stats(self) -> StatsResult:
        """Engine and tier statistics."""
        req = self._pb.v1.StatsRequest()
        r, us = self._call(lambda s, t: s.Stats(req, timeout=t))
        return StatsResult(
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


class _BearerInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer TOKEN`` to every call."""

    def __init__(self, token: str):
        self._md = ("authorization", f"Bearer {token}")

    def _details(self, d):
        md = list(d.metadata or []) + [self._md]
        return d._replace(metadata=md) if hasattr(d, "_replace") else _Details(d, md)

    def intercept_unary_unary(self, cont, d, req):
        return cont(self._details(d), req)

    def intercept_unary_stream(self, cont, d, req):
        return cont(self._details(d), req)

    def intercept_stream_unary(self, cont, d, reqs):
        return cont(self._details(d), reqs)

    def intercept_stream_stream(self, cont, d, reqs):
        return cont(self._details(d), reqs)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d, metadata):
        self.method = d.method
        self.timeout = d.timeout
        self.metadata = metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


def _add_timing(a, b) -> None:
    """Adds server timing ``b`` to ``a`` (``kvtier.v1.ServerTiming`` messages)."""
    for f in _TIMING_FIELDS:
        setattr(a, f, getattr(a, f) + getattr(b, f))


def _native_block(b: Block) -> tuple[bytes, bytes | None, int, Any, int]:
    """A block as the native core takes it; a payload given as parts is joined (copied)."""
    if not isinstance(b, Block):
        raise TypeError(f"expected kvtier.Block, got {type(b).__name__}")
    payload = _joined(b.payload) if isinstance(b.payload, (list, tuple)) else b.payload
    return bytes(b.key), bytes(b.parent) if b.parent else None, b.token_count, payload, b.ttl_ms


def _as_parts(payload):
    """A payload for the data plane: bytes as is, one buffer as a byte view, a
    list of buffers as a tuple of byte views (sent back to back)."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, (list, tuple)):
        return tuple(p if isinstance(p, bytes) else memoryview(p).cast("B") for p in payload)
    return memoryview(payload).cast("B")


def _joined(payload) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, (list, tuple)):
        return b"".join(bytes(p) for p in payload)
    return bytes(payload)


def _crc_of(payload) -> int:
    """CRC32C of a payload given as one buffer or as consecutive parts."""
    if isinstance(payload, (list, tuple)):
        c = 0
        for p in payload:
            c = crc32c(p, c)
        return c
    return crc32c(payload)


def _fill(view_or_parts, payload) -> memoryview | list[memoryview]:
    """Copies ``payload`` into one writable buffer or consecutive parts; returns what was filled."""
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


def _copy_into(b: ReadBlock, into) -> ReadBlock:
    """``read(into=...)``: the payload copied into the caller's buffer. A
    buffer that cannot take it is the caller's mistake: INVALID_ARGUMENT,
    not retried."""
    buf = into(b.index, len(b.payload))
    if buf is None:
        return b
    try:
        filled = _fill(buf, b.payload)
    except ValueError as e:
        raise KvtierError(grpc.StatusCode.INVALID_ARGUMENT, f"buffer for block {b.index}: {e}") from None
    return ReadBlock(b.index, b.key, b.parent, b.token_count, filled, b.tier)


def _data_plane_addr(target: str, advertised: str) -> tuple[str, int]:
    """Where to dial the data plane: the advertised address, with an
    unspecified host (``0.0.0.0``, ``::``) replaced by the gRPC target's host."""
    host, port = _dp.parse_addr(advertised)
    if host in ("0.0.0.0", "::", ""):
        try:
            host = _dp.parse_addr(target)[0]
        except ValueError:
            host = "127.0.0.1"
    return host, port
