"""The client of one kvtier server (``kvtier.v1``, mirrors crates/kvtier-client).

* A pool of N gRPC channels (separate HTTP/2 connections: one TCP stream caps
  throughput), used round-robin; token and TLS as :mod:`kvtier.channels` sets them up.
* A deadline on every call (``timeout`` seconds, covering retries), and
  retries of ``UNAVAILABLE`` within it (:mod:`kvtier.retry`).
* End-to-end checksums: CRC32C computed on write, verified on read.
* ``read`` / ``write`` over the server's same-host socket (``docs/local.md``:
  blocks copied straight into the caller's buffers) or bulk data plane
  (``docs/wire.md``) when it advertises one, by the Rust client core
  (:mod:`kvtier.dataplane`, chosen by :mod:`kvtier.discovery`); gRPC otherwise.
* The key scheme, so callers can pass tokens instead of keys.

Users get it as :class:`kvtier.Client` (:mod:`kvtier.client`), which also
accepts several addresses; :mod:`kvtier.cluster` builds on one of these per node.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Callable, TypeVar

import grpc

from . import dataplane as _dp
from . import keys as _keys
from . import payloads as _payloads
from . import split as _split
from ._proto import load as _load_proto
from .channels import MAX_MESSAGE_SIZE, grpc_target, local_path, open_channels
from .discovery import DataPlaneChoice
from .errors import KvtierError
from .results import (
    Block,
    DeleteResult,
    LeaseResult,
    LookupResult,
    ReadBlock,
    ReadResult,
    ServerTiming,
    StatsResult,
    Tier,
    TierCount,
    WriteResult,
    token_chain,
)
from .retry import retrying

__all__ = ["NodeClient"]

T = TypeVar("T")
_Self = TypeVar("_Self", bound="NodeClient")


class NodeClient:
    """A pooled, thread-safe ``kvtier.v1`` client of one server.

    :param target: ``host:port`` (an ``http://`` prefix is accepted), or the
        server's same-host socket, ``unix:///path``.
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
        if not isinstance(target, str):  # several addresses are kvtier.Client's (a cluster)
            raise TypeError(f"{type(self).__name__} takes one address, not {type(target).__name__}")
        self.target = grpc_target(target)
        self.timeout = float(timeout)
        self.block_size = block_size
        self.hash = hash
        if salt is None:
            salt = os.environ.get("KVTIER_KEY_SALT", "")
        self._salt = salt.encode() if isinstance(salt, str) else bytes(salt)
        self.retries = retries
        self.retry_shed = retry_shed
        self._pb = _load_proto()
        ch = open_channels(target, connections, token, tls_ca, tls_cert, tls_key, tls_server_name)
        self._channels = ch.channels
        self._stubs = [self._pb.v1_grpc.KvTierStub(c) for c in self._channels]
        self._next = itertools.count()
        self._rr_lock = threading.Lock()
        self._closed = False
        self._max_message: int | None = None
        self._data_plane = bool(data_plane)
        self._wire = DataPlaneChoice(
            self.target, local_path(target), enabled=self._data_plane, same_host=same_host, pb=self._pb,
            connections=data_connections or connections, timeout=self.timeout, token=ch.token,
            max_stripes=read_stripes, congestion=data_tcp_congestion or None, tls_pems=ch.tls_pems,
            tls_name=ch.tls_name,
        )

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
            self._wire.close()

    def data_plane(self) -> _dp.DataPlane | None:
        """The data plane ``read`` / ``write`` use, or ``None`` when they use gRPC.

        The first call asks the server (``Stats``) and connects, choosing as
        the Rust client does (:mod:`kvtier.discovery`): the same-host socket
        when the target is ``unix://PATH``, or when the server advertises one
        that exists here and leads back to the same server; else the TCP data
        plane; else gRPC. The choice is logged once. Errors of that call, and
        a data plane that refuses the token, propagate and discovery is tried
        again next time. An advertised data plane that cannot be reached (a
        container that publishes only the gRPC port, say) is logged and this
        client uses gRPC from then on; so does a Python without ``kvtier._native``.
        """
        return self._wire.get(self.stats)

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r}, connections={len(self._channels)}, timeout={self.timeout})"

    def _call(self, fn: Callable[[Any, float], T], timeout: float | None = None) -> tuple[T, int]:
        """Runs ``fn(stub, remaining_seconds)`` with retries on UNAVAILABLE (``stub``: a
        ``KvTierStub``, generated and loaded at run time, hence ``Any``).

        Returns the result and the end-to-end time in microseconds.
        """
        return self._retrying(lambda remaining: fn(self.stub(), remaining), timeout)

    def _retrying(self, fn: Callable[[float], T], timeout: float | None = None) -> tuple[T, int]:
        """Runs ``fn(remaining_seconds)`` with this client's retries (:func:`kvtier.retry.retrying`)
        within ``timeout`` seconds (default the client's)."""
        budget = self.timeout if timeout is None else float(timeout)
        return retrying(fn, budget, self.retries, self.retry_shed)

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
                checked = _keys.check_keys(keys)
            req = pb.LookupRequest(namespace=namespace, keys=checked, lease_ms=lease_ms)
        r, us = self._call(lambda s, t: s.Lookup(req, timeout=t), timeout)
        return LookupResult(
            found=r.found_blocks,
            tiers=[Tier.of(t) for t in r.tiers],
            keys=checked if checked is not None else list(r.keys),
            lease_id=r.lease_id,
            lease_expires_unix_ms=r.lease_expires_unix_ms,
            timing=ServerTiming._of(r, us),
            nodes=list(r.nodes),
            tier_counts=[TierCount(c.node, Tier.of(c.tier), c.blocks, c.leading) for c in r.tier_counts],
        )

    def read(
        self,
        namespace: str,
        keys: Sequence[bytes],
        lease_id: int = 0,
        timeout: float | None = None,
        into: Callable[[int, int], object] | None = None,
        sizes: int | Sequence[int] | None = None,
    ) -> ReadResult:
        """Reads ``keys`` in order; the server stops at the first missing block.

        Each payload's CRC32C is verified; a mismatch raises ``KvtierError(DATA_LOSS)``.
        ``timeout`` (seconds) overrides the client's deadline for this call.

        ``into(index, nbytes)`` lets the caller provide the destination of
        block ``index`` (its position in ``keys``): a writable buffer of at
        least ``nbytes``, a list of writable buffers filled one after the
        other (scatter), or ``None`` for a new buffer. The block's
        ``payload`` is then a memoryview of the filled bytes (a list of them
        for a scatter list), checksum verified. A buffer too small for its
        block raises ``KvtierError(INVALID_ARGUMENT)``. A retried call may
        write into the same buffers again.

        ``sizes``: the blocks' sizes when the caller knows them (one ``int``
        for every key, or one per key), as an engine does from its layout.
        Then ``into(index, sizes[index])`` is called once per key, in order,
        before anything is read (also for keys whose blocks then turn out
        missing), and the blocks are read straight into what it returned
        (:meth:`read_into`: by the server itself on the same-host socket,
        received into them over TCP): no new ``bytes``, no second copy. A
        block may be shorter than its size (its payload says how long it
        is); a longer one raises ``KvtierError(INVALID_ARGUMENT)``. ``None``
        from ``into`` gets a new ``bytearray`` of the size.

        Without ``sizes``, ``into(index, nbytes)`` is called with each
        block's exact size once the blocks have arrived, and each payload is
        copied from a new ``bytes`` into its buffer (``None``: the payload
        stays that ``bytes``): a copy and page faults more than with ``sizes``
        (notes/060-same-host-fixes.md).

        Over the data plane a read of 16 keys or more is striped
        (``read_stripes``, at most ``data_connections``): contiguous runs of
        keys are read at once on separate connections, and joined in key
        order up to the first run that stopped short (a missing block, the
        deadline), whose reason the result carries, exactly as one request
        would answer. An error in any run fails the whole read (and
        ``UNAVAILABLE`` retries all of it).
        """
        ks = _keys.check_keys(keys)
        if into is not None and sizes is not None:
            return self.read_into(namespace, ks, _payloads.destinations(into, sizes, len(ks)), lease_id, timeout)
        pool = self.data_plane()
        if pool is not None:
            got, us = self._retrying(lambda t: pool.read(namespace, ks, lease_id, t), timeout)
            blocks = [ReadBlock(i, k, p, n, payload, Tier.of(tier)) for i, k, p, n, payload, tier in got[0]]
            if into is not None:
                blocks = [_payloads.copy_into(b, into) for b in blocks]
            return ReadResult._of_native(blocks, len(ks), got, us)
        req = self._pb.v1.ReadRequest(namespace=namespace, keys=ks, lease_id=lease_id)

        def attempt(stub, t):
            blocks: list[ReadBlock] = []
            done = None
            for msg in stub.Read(req, timeout=t):
                which = msg.WhichOneof("item")
                if which == "block":
                    blocks.append(_payloads.read_block(msg.block))
                elif which == "done":
                    done = msg.done
            return blocks, done

        (blocks, done), us = self._call(attempt, timeout)
        if into is not None:
            blocks = [_payloads.copy_into(b, into) for b in blocks]
        return ReadResult._of_done(blocks, len(ks), done, us)

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
        the first missing block. A key's buffer may also be a list or tuple
        of such buffers, which its block fills in order: an engine whose
        cache keeps each layer apart gets each block straight into its
        layers, with no staging copy.

        Each block's ``payload`` is a memoryview of the filled bytes of its
        buffer (for a list of parts, a list of memoryviews of each part's
        filled bytes). On the same-host socket the blocks are copied into the
        buffers straight out of kvtier's shared memory (one copy, no bytes
        through the socket; docs/local.md);
        over the TCP data plane they are received straight into them, each
        checksum verified; over gRPC they are copied in. A buffer too small
        for its block raises ``KvtierError(INVALID_ARGUMENT)``; one that is
        read-only or not contiguous, ``ValueError``. After an error
        the buffers' contents are unspecified; a retried call fills them again.
        """
        ks = _keys.check_keys(keys)
        if len(buffers) != len(ks):
            raise ValueError(f"{len(ks)} keys but {len(buffers)} buffers")
        pool = self.data_plane()
        if pool is None:
            r = self.read(namespace, ks, lease_id, timeout)
            blocks = []
            for b in r.blocks:
                try:
                    filled = _payloads.fill(buffers[b.index], b.payload)
                except ValueError as e:
                    raise KvtierError(grpc.StatusCode.INVALID_ARGUMENT, f"buffer {b.index}: {e}") from None
                blocks.append(ReadBlock(b.index, b.key, b.parent, b.token_count, filled, b.tier))
            return ReadResult(blocks, r.requested, r.partial, r.reason, r.timing)
        got, us = self._retrying(lambda t: pool.read_into(namespace, ks, lease_id, buffers, t), timeout)
        blocks = [
            ReadBlock(i, k, p, n, _payloads.filled(buffers[i], length), Tier.of(tier))
            for i, k, p, n, length, tier in got[0]
        ]
        return ReadResult._of_native(blocks, len(ks), got, us)

    def map_read(self, namespace: str, keys: Sequence[bytes], lease_id: int = 0,
                 timeout: float | None = None) -> _dp.MappedRead:
        """Reads ``keys`` in order and leaves the blocks in kvtier's shared
        memory, for a caller that moves them itself: a GPU engine registers
        ``segments`` once and DMAs each of ``regions`` into its KV cache, with
        no copy on the CPU (docs/local.md). Same-host socket only
        (``FAILED_PRECONDITION`` elsewhere). One request: a result with
        reason ``size`` is continued by another call. Release it (or use it
        in a ``with`` block) as soon as the bytes are moved: the server
        holds its slots until then."""
        ks = _keys.check_keys(keys)
        pool = self.data_plane()
        if pool is None or not pool.target.startswith("unix://"):
            raise KvtierError(grpc.StatusCode.FAILED_PRECONDITION,
                              "map_read needs the same-host socket (docs/local.md)")
        t = self.timeout if timeout is None else timeout
        return pool.map_read(namespace, ks, lease_id, t)

    def write(self, namespace: str, blocks: Iterable[Block], timeout: float | None = None) -> WriteResult:
        """Stores a batch of blocks (checksums computed here).

        The server verifies every block of a request before storing any of
        them. A batch larger than the server takes in one request (its
        ``Stats.max_message_size``) goes as several, one after another, over
        the data plane and over gRPC alike; each is stored whole or not at all, and a
        failed one fails the call, whatever the others stored. Payloads
        may be any bytes-like object (``bytes``, ``memoryview``, a tensor's
        buffer); over the data plane they are sent without a copy.
        ``timeout`` (seconds) overrides the client's deadline for this call.
        """
        pool = self.data_plane()
        if pool is not None:
            # Checksums are computed by the native core, payloads passed as they are.
            items = [_payloads.native_block(b) for b in blocks]
            (stored, existing, deferred, timing), us = self._retrying(
                lambda t: pool.write(namespace, items, t), timeout)
            return WriteResult(stored, existing, ServerTiming(elapsed_us=us, **timing), deferred)
        # Cut to the server's message limit, as the native core cuts its writes (kvtier.split).
        v1 = self._pb.v1
        reqs = [v1.WriteRequest(namespace=namespace, blocks=_payloads.pb_blocks(v1, run))
                for run in _split.runs(list(blocks), self._message_limit())]
        if len(reqs) == 1:
            r, us = self._call(lambda s, t: s.Write(reqs[0], timeout=t), timeout)
            return WriteResult(r.stored, r.existing, ServerTiming._of(r, us), r.deferred)

        def attempt(t: float) -> list[Any]:
            # One after another, as the native core: two requests near the limit at once
            # would not fit the server's request memory together (kvtier.split).
            end = time.monotonic() + t
            return [self.stub().Write(r, timeout=max(end - time.monotonic(), 0.001)) for r in reqs]

        rs, us = self._retrying(attempt, timeout)
        return WriteResult(sum(r.stored for r in rs), sum(r.existing for r in rs),
                           _split.summed([ServerTiming._of(r) for r in rs], us), sum(r.deferred for r in rs))

    def _message_limit(self) -> int:
        """The largest request the server takes (``Stats.max_message_size``), asked once."""
        if self._max_message is None:
            # Never past what this client's channels send either.
            self._max_message = min(self.stats().max_message_size or _split.DEFAULT_LIMIT, MAX_MESSAGE_SIZE)
        return self._max_message

    def write_stream(self, namespace: str, blocks: Iterable[Block], batch_bytes: int = 16 << 20) -> WriteResult:
        """Stores blocks as a client stream of batches of about ``batch_bytes`` each.

        For writes too large for one message. Unlike :meth:`write`, batches
        already sent are stored even if a later one fails.
        """
        batches: list[list] = [[]]
        size = 0
        for b in _payloads.pb_blocks(self._pb.v1, blocks):
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
        return WriteResult(r.stored, r.existing, ServerTiming._of(r, us), r.deferred)

    def write_tokens(
        self, namespace: str, tokens: Sequence[int], payloads: Sequence[bytes], ttl_ms: int = 0
    ) -> WriteResult:
        """Writes one payload per full block of ``tokens``, chained parent to child."""
        return self.write(namespace, token_chain(self.keys_for(tokens), payloads, self.block_size, len(tokens),
                                                 ttl_ms))

    def delete(self, namespace: str, keys: Sequence[bytes], timeout: float | None = None) -> DeleteResult:
        """Deletes blocks (and their descendants)."""
        req = self._pb.v1.DeleteRequest(namespace=namespace, keys=_keys.check_keys(keys))
        r, us = self._call(lambda s, t: s.Delete(req, timeout=t), timeout)
        return DeleteResult(r.deleted, ServerTiming._of(r, us))

    def lease(self, namespace: str, keys: Sequence[bytes], lease_ms: int) -> LeaseResult:
        """Pins explicit keys against eviction for ``lease_ms``."""
        req = self._pb.v1.LeaseRequest(namespace=namespace, keys=_keys.check_keys(keys), lease_ms=lease_ms)
        r, us = self._call(lambda s, t: s.Lease(req, timeout=t))
        return LeaseResult(r.lease_id, r.lease_expires_unix_ms, ServerTiming._of(r, us))

    def release(self, lease_id: int, timeout: float | None = None) -> LeaseResult:
        """Ends a lease early."""
        if lease_id == 0:
            raise ValueError("lease id 0 is not a lease")
        req = self._pb.v1.LeaseRequest(release_lease_id=lease_id)
        r, us = self._call(lambda s, t: s.Lease(req, timeout=t), timeout)
        return LeaseResult(r.lease_id, r.lease_expires_unix_ms, ServerTiming._of(r, us))

    def stats(self) -> StatsResult:
        """Engine and tier statistics."""
        req = self._pb.v1.StatsRequest()
        r, us = self._call(lambda s, t: s.Stats(req, timeout=t))
        return StatsResult._of(r, us)
