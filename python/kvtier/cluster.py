"""A client for a kvtier cluster: one :class:`~kvtier.node.NodeClient` per node,
blocks placed by rendezvous hashing (:func:`kvtier.keys.owners`, docs/cluster.md).

``kvtier.Client(["h1:p1", "h2:p2", ...])`` (or ``Client("h1:p1,h2:p2")``)
returns a :class:`ClusterClient`. It keeps no state about blocks: each call
computes every key's owners from the node list, sends each node the part it
owns (nodes in parallel) and puts the answers back together in the caller's
order. A node that does not answer (``UNAVAILABLE`` or a timeout) is skipped
for ``down_for`` seconds and its part goes to the key's next owner. A node
that sheds a request (``UNAVAILABLE`` with a retry hint) did answer: it is
busy, not down, so it is not skipped and the caller sees the error.

>>> from kvtier import Client
>>> with Client(["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]) as c:  # doctest: +SKIP
...     c.write_tokens("my-model", tokens, payloads)
...     r = c.read("my-model", c.keys_for(tokens))
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any, Callable

import grpc

from . import keys as _keys
from . import payloads as _payloads
from .errors import KvtierError
from .node import NodeClient
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
    TierStats,
    WriteResult,
    token_chain,
)
from .routing import Router, unreachable

__all__ = ["ClusterClient", "DEFAULT_DOWN_FOR"]

#: Seconds a node that did not answer is skipped (unless every node is).
DEFAULT_DOWN_FOR = 5.0

#: Leases remembered (to send each to the node that granted it) before
#: expired ones are forgotten (the Rust client's ``LEASES_KEPT``).
_LEASES_KEPT = 1024


def _addresses(targets: str | Sequence[str]) -> list[str]:
    items = targets.split(",") if isinstance(targets, str) else list(targets)
    out = []
    for a in items:
        if not isinstance(a, str):
            raise TypeError(f"a node address must be a str, not {type(a).__name__}")
        if a.strip():
            out.append(a.strip())
    return out


def _summed(timings: Iterable[ServerTiming], elapsed_us: int) -> ServerTiming:
    """Server-side times added up over the nodes asked (work, not latency:
    the nodes run in parallel); ``elapsed_us`` the whole call's."""
    ts = list(timings)
    names = [f.name for f in dataclasses.fields(ServerTiming) if f.name != "elapsed_us"]
    return ServerTiming(elapsed_us=elapsed_us, **{n: sum(getattr(t, n) for t in ts) for n in names})


class ClusterClient:
    """A thread-safe client for a kvtier cluster, with :class:`~kvtier.Client`'s methods.

    :param targets: the nodes' addresses, a list or one comma-separated
        string. A node's name (what placement hashes) is its address without
        a ``grpc://`` or ``http://`` prefix (:func:`kvtier.keys.node_name`);
        give the same list the servers are configured with.
    :param replicas: owners per block (the servers' setting). Reads ask up to
        this many owners that answer before a block counts as missing.
    :param down_for: seconds a node that did not answer is skipped. When
        every node is marked down, they are tried anyway.
    :param args, kwargs: everything else :class:`~kvtier.Client` takes
        (``connections``, ``timeout``, ``token``, TLS, ``salt``...), given
        to the client of every node.

    How each call is routed (``owners`` = :func:`kvtier.keys.owners` over the
    nodes not marked down, ``first owner`` its first):

    * ``write`` / ``write_stream`` / ``write_tokens``: blocks grouped by
      their first owner, one request per node, nodes in parallel. A node
      that does not answer is marked down and its blocks go to their next
      owner (the first owner among the nodes still up).
    * ``read``: keys grouped the same way; the answer is in the caller's
      order, a prefix ending at the first block no owner has. A block a
      node does not return is asked of its next owner, up to ``replicas``
      owners that answered. ``into(index, nbytes)`` gets the index in the
      caller's ``keys``; with several nodes it is called from several
      threads at once, and buffers of blocks after the first missing one
      may be filled though they are not returned.
    * ``lookup`` / ``lease``: the whole chain to the first owner of its
      first key (a cluster node answers for the whole cluster). Keys from
      tokens are computed here, also with ``hash_on_server=True`` (the
      tokens are still sent, the server's keys returned).
    * ``delete``: each key to its first owner (the server deletes on every
      node). ``release`` goes to the node that gave the lease.
    * ``stats``: every node's stats added up (:meth:`node_stats` gives them
      one by one); in a cluster each replica of a block counts.

    A lease id belongs to the node that granted it: a read sends it to that
    node only, and ``release`` goes there. The lookup's (or ``lease``'s)
    result names the node (``lease_node``); this client remembers it for the
    leases it took, until they expire. A client that did not take the lease
    (another process: vLLM's workers read what its scheduler leased) needs
    ``lease_node=`` with the id.
    Server timings of a call that asked several nodes are their sums.
    """

    def __init__(
        self,
        targets: str | Sequence[str],
        *args: Any,
        replicas: int = _keys.DEFAULT_REPLICAS,
        down_for: float = DEFAULT_DOWN_FOR,
        **kwargs: Any,
    ):
        addrs = _addresses(targets)
        if not addrs:
            raise ValueError("a cluster needs at least one node address")
        names = [_keys.node_name(a) for a in addrs]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError(f"node listed twice: {', '.join(dups)}")
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be an int >= 1, not {replicas!r}")
        if down_for < 0:
            raise ValueError("down_for must be >= 0")
        #: The nodes' names, in the order given.
        self.nodes: list[str] = names
        self.replicas = replicas
        clients: dict[str, NodeClient] = {}
        try:
            for addr, name in zip(addrs, names):
                clients[name] = NodeClient(addr, *args, **kwargs)
        except BaseException:
            for c in clients.values():
                c.close()
            raise
        first = clients[names[0]]
        self.timeout = first.timeout
        self.block_size = first.block_size
        self.hash = first.hash
        self._clients = clients
        self._router = Router(clients, float(down_for), self.timeout)
        self._leases: dict[int, tuple[str, float]] = {}  # lease id -> (granting node, monotonic expiry)
        self._lock = threading.Lock()
        self._closed = False

    # -- plumbing ---------------------------------------------------------

    @property
    def pb(self):
        """The generated messages of ``kvtier.v1``."""
        return self._clients[self.nodes[0]].pb

    def node(self, name: str) -> NodeClient:
        """The single-node client of ``name`` (an address is accepted), for calls this API does not route."""
        return self._clients[_keys.node_name(name)]

    @property
    def down_for(self) -> float:
        """Seconds a node that did not answer is skipped (settable)."""
        return self._router.down_for

    @down_for.setter
    def down_for(self, seconds: float) -> None:
        self._router.down_for = float(seconds)

    def down(self) -> list[str]:
        """The nodes skipped now, because they did not answer lately."""
        return self._router.down()

    def owners(self, namespace: str, key: bytes) -> list[str]:
        """Where ``key`` lives now: its ``replicas`` first owners among the nodes not marked down."""
        down = set(self.down())
        live = [n for n in self.nodes if n not in down] or self.nodes
        return _keys.owners(live, namespace, key, self.replicas)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._router.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ClusterClient({self.nodes!r}, replicas={self.replicas}, timeout={self.timeout})"

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("client is closed")

    def _remember_lease(self, lease_id: int, node: str, lease_ms: int) -> None:
        """Notes the node that granted a lease. Leases read or released by
        another process are never released here: expired ones are dropped
        once ``_LEASES_KEPT`` are noted, so only live leases stay."""
        if not lease_id:
            return
        now = time.monotonic()
        with self._lock:
            if len(self._leases) >= _LEASES_KEPT:
                self._leases = {k: v for k, v in self._leases.items() if v[1] > now}
            self._leases[lease_id] = (node, now + lease_ms / 1000)

    def _lease_node(self, lease_node: str | None) -> str | None:
        """``lease_node`` as a node name (``None`` stays ``None``)."""
        if lease_node is None or lease_node == "":
            return None
        name = _keys.node_name(lease_node)
        if name not in self._clients:
            raise ValueError(f"lease node {lease_node!r} is not one of this client's nodes")
        return name

    # -- keys -------------------------------------------------------------

    def keys_for(self, tokens: Sequence[int]) -> list[bytes]:
        """Keys of the full blocks of ``tokens`` under the clients' scheme."""
        return self._clients[self.nodes[0]].keys_for(tokens)

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
        """:meth:`kvtier.Client.lookup` on the first owner of the first key."""
        self._check_open()
        if (keys is None) == (tokens is None):
            raise ValueError("give exactly one of keys or tokens")
        if tokens is not None:
            toks = list(tokens)
            ks = self.keys_for(toks)
        else:
            assert keys is not None  # exactly one of keys and tokens (checked above)
            ks = _keys.check_keys(keys)

        def call(c: NodeClient, t: float) -> LookupResult:
            if tokens is not None and hash_on_server:
                return c.lookup(namespace, tokens=toks, lease_ms=lease_ms, hash_on_server=True, timeout=t)
            return c.lookup(namespace, keys=ks, lease_ms=lease_ms, timeout=t)

        node, r = self._router.to_first_owner(namespace, ks[0] if ks else None, call, timeout)
        if r.lease_id:
            self._remember_lease(r.lease_id, node, lease_ms)
            r = dataclasses.replace(r, lease_node=node)
        return r

    def read_into(
        self,
        namespace: str,
        keys: Sequence[bytes],
        buffers: Sequence[Any],
        lease_id: int = 0,
        timeout: float | None = None,
        lease_node: str | None = None,
    ) -> ReadResult:
        """:meth:`kvtier.Client.read_into` for a cluster: ``keys`` read from
        their owners into ``buffers`` (one per key), in ``keys``' order."""
        if len(buffers) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(buffers)} buffers")
        return self.read(namespace, keys, lease_id, timeout, into=lambda i, n: buffers[i],
                         sizes=[_payloads.capacity(b) for b in buffers], lease_node=lease_node)

    def read(
        self,
        namespace: str,
        keys: Sequence[bytes],
        lease_id: int = 0,
        timeout: float | None = None,
        into: Callable[[int, int], object] | None = None,
        lease_node: str | None = None,
        sizes: int | Sequence[int] | None = None,
    ) -> ReadResult:
        """Reads ``keys`` from their owners; the answer is in ``keys``' order
        and ends at the first block no owner has (:meth:`kvtier.Client.read`,
        whose ``into`` and ``sizes`` these are; with ``sizes`` each node's
        part is read straight into the buffers).

        ``lease_node``: the node that granted ``lease_id`` (the lookup's
        ``lease_node``); needed when this client did not take the lease."""
        self._check_open()
        ks = _keys.check_keys(keys)
        per = None if sizes is None else [sizes] * len(ks) if isinstance(sizes, int) else list(sizes)
        if per is not None and len(per) != len(ks):
            raise ValueError(f"{len(ks)} keys but {len(per)} sizes")
        granted_by = self._lease_node(lease_node)
        if not ks:
            return self._router.to_first_owner(
                namespace, None, lambda c, t: c.read(namespace, [], lease_id, timeout=t), timeout)[1]
        start = time.monotonic()
        deadline = self._router.deadline(timeout)
        ranks = [_keys.rank(self.nodes, namespace, k) for k in ks]
        misses: list[set[str]] = [set() for _ in ks]  # nodes that answered without the block
        failed: set[str] = set()
        last: KvtierError | None = None
        got: dict[int, ReadBlock] = {}
        timings: list[ServerTiming] = []
        end, reason = len(ks), ""  # where the answer ends, and why
        pending = list(range(len(ks)))
        while True:
            groups: dict[str, list[int]] = {}
            down = set(self.down())
            for i in sorted(pending):
                if i >= end:
                    break
                node = self._router.pick(ranks[i], down, failed, misses[i]) if len(misses[i]) < self.replicas else None
                if node is None:
                    if not misses[i]:  # every node failed
                        assert last is not None
                        raise last
                    end, reason = i, "missing"
                    break
                groups.setdefault(node, []).append(i)
            groups = {n: [i for i in ix if i < end] for n, ix in groups.items()}
            groups = {n: ix for n, ix in groups.items() if ix}
            if not groups:
                break
            left = self._router.remaining(deadline, start)
            pending = []

            calls = {n: partial(self._read_part, self._clients[n], namespace, ks, ix, self._lease_for(n, lease_id, granted_by),
                                left, into, per)
                     for n, ix in groups.items()}
            for node, out in self._router.run(calls):
                ix = groups[node]
                if isinstance(out, KvtierError):
                    if not unreachable(out):
                        raise out
                    failed.add(node)
                    pending += ix
                    last = out
                    continue
                timings.append(out.timing)
                for b in out.blocks:
                    if not 0 <= b.index < len(ix):
                        raise KvtierError(grpc.StatusCode.INTERNAL,
                                          f"node {node} returned block {b.index} of a {len(ix)}-key read")
                    got[ix[b.index]] = dataclasses.replace(b, index=ix[b.index])
                n = len(out.blocks)
                if n < len(ix):
                    if out.reason in ("missing", ""):
                        misses[ix[n]].add(node)  # the next owner is asked; the rest of this node's part again
                        pending += ix[n:]
                    elif ix[n] < end:
                        end, reason = ix[n], out.reason  # e.g. deadline: the answer ends there
        blocks = [got[i] for i in range(end)]
        elapsed = int((time.monotonic() - start) * 1e6)
        return ReadResult(blocks, len(ks), end < len(ks), reason, _summed(timings, elapsed))

    def _lease_for(self, node: str, lease_id: int, granted_by: str | None = None) -> int:
        """The lease id to send ``node`` with a read: the id for the node that
        granted it (``granted_by``, else as noted by this client's lookup; for
        every node when neither knows), 0 for the others, which would refuse
        a lease they never granted."""
        if not lease_id:
            return 0
        if granted_by is None:
            with self._lock:
                granted_by = self._leases.get(lease_id, (None, 0.0))[0]
        return lease_id if granted_by in (None, node) else 0

    @staticmethod
    def _read_part(c: NodeClient, namespace: str, ks: list[bytes], ix: list[int], lease_id: int, timeout: float,
                   into: Callable[[int, int], object] | None, sizes: list[int] | None = None) -> ReadResult:
        """One node's part of a read: ``ks[i] for i in ix``; ``into`` sees indexes into ``ks``."""
        shifted = None
        if into is not None:
            dest = into
            shifted = lambda j, n: dest(ix[j], n)  # noqa: E731
        part = None if sizes is None or into is None else [sizes[i] for i in ix]
        return c.read(namespace, [ks[i] for i in ix], lease_id, timeout=timeout, into=shifted, sizes=part)

    def write(self, namespace: str, blocks: Iterable[Block], timeout: float | None = None) -> WriteResult:
        """Stores each block on its first owner, nodes in parallel (:meth:`kvtier.Client.write`).

        Unlike a single node's write, a failure of one node's part (other
        than not answering) leaves the other nodes' parts stored."""
        self._check_open()
        bs = list(blocks)
        for b in bs:
            if not isinstance(b, Block):
                raise TypeError(f"expected kvtier.Block, got {type(b).__name__}")
        start = time.monotonic()
        if not bs:
            return self._router.to_first_owner(namespace, None, lambda c, t: c.write(namespace, [], t), timeout)[1]
        rs = self._router.grouped(namespace, [bytes(b.key) for b in bs],
                           lambda c, ix, t: c.write(namespace, [bs[i] for i in ix], t), timeout)
        return WriteResult(sum(r.stored for r in rs), sum(r.existing for r in rs),
                           _summed((r.timing for r in rs), int((time.monotonic() - start) * 1e6)),
                           sum(r.deferred for r in rs))

    def write_stream(self, namespace: str, blocks: Iterable[Block], batch_bytes: int = 16 << 20) -> WriteResult:
        """:meth:`kvtier.Client.write_stream` to each block's first owner, nodes in parallel."""
        self._check_open()
        bs = list(blocks)
        for b in bs:
            if not isinstance(b, Block):
                raise TypeError(f"expected kvtier.Block, got {type(b).__name__}")
        start = time.monotonic()
        rs = self._router.grouped(namespace, [bytes(b.key) for b in bs],
                           lambda c, ix, t: c.write_stream(namespace, [bs[i] for i in ix], batch_bytes), None)
        return WriteResult(sum(r.stored for r in rs), sum(r.existing for r in rs),
                           _summed((r.timing for r in rs), int((time.monotonic() - start) * 1e6)),
                           sum(r.deferred for r in rs))

    def write_tokens(
        self, namespace: str, tokens: Sequence[int], payloads: Sequence[bytes], ttl_ms: int = 0
    ) -> WriteResult:
        """Writes one payload per full block of ``tokens``, chained parent to child."""
        return self.write(namespace, token_chain(self.keys_for(tokens), payloads, self.block_size, len(tokens),
                                                 ttl_ms))

    def delete(self, namespace: str, keys: Sequence[bytes], timeout: float | None = None) -> DeleteResult:
        """Deletes each key (and its descendants) through its first owner."""
        self._check_open()
        ks = _keys.check_keys(keys)
        start = time.monotonic()
        if not ks:
            return self._router.to_first_owner(namespace, None, lambda c, t: c.delete(namespace, [], t), timeout)[1]
        rs = self._router.grouped(namespace, ks, lambda c, ix, t: c.delete(namespace, [ks[i] for i in ix], t), timeout)
        return DeleteResult(sum(r.deleted for r in rs),
                            _summed((r.timing for r in rs), int((time.monotonic() - start) * 1e6)))

    def lease(self, namespace: str, keys: Sequence[bytes], lease_ms: int) -> LeaseResult:
        """Pins explicit keys for ``lease_ms``, through the first owner of the first key."""
        self._check_open()
        ks = _keys.check_keys(keys)
        node, r = self._router.to_first_owner(namespace, ks[0] if ks else None,
                                       lambda c, t: c.lease(namespace, ks, lease_ms))
        if r.lease_id:
            self._remember_lease(r.lease_id, node, lease_ms)
            r = dataclasses.replace(r, lease_node=node)
        return r

    def release(self, lease_id: int, timeout: float | None = None, lease_node: str | None = None) -> LeaseResult:
        """Ends a lease early, on the node that granted it: ``lease_node``,
        else the one noted by this client's lookup, else the first node."""
        self._check_open()
        if lease_id == 0:
            raise ValueError("lease id 0 is not a lease")
        node = self._lease_node(lease_node)
        with self._lock:
            noted = self._leases.pop(lease_id, None)
        if node is None and noted is not None:
            node = noted[0]
        c = self._clients[node if node is not None else self.nodes[0]]
        r = c.release(lease_id, timeout)
        return dataclasses.replace(r, lease_node=node or self.nodes[0])

    def node_stats(self) -> dict[str, StatsResult | KvtierError]:
        """Each node's :meth:`kvtier.Client.stats`, or the error it answered with, by node name."""
        self._check_open()
        calls = {n: c.stats for n, c in self._clients.items()}
        return dict(self._router.run(calls))

    def stats(self) -> StatsResult:
        """The nodes' stats added up: tiers by kind, leases and expired blocks
        summed; ``version`` the nodes' versions (comma-separated when they
        differ); ``data_listen`` empty. Nodes that do not answer are left
        out (:meth:`node_stats` shows them); when none answers, its error is raised."""
        start = time.monotonic()
        per_node = self.node_stats()
        ok = [r for r in per_node.values() if isinstance(r, StatsResult)]
        errors = [r for r in per_node.values() if isinstance(r, KvtierError)]
        if errors and (not ok or not all(unreachable(e) for e in errors)):
            raise next((e for e in errors if not unreachable(e)), errors[0])
        tiers: dict[Tier, list[int]] = {}
        for r in ok:
            for t in r.tiers:
                acc = tiers.setdefault(t.tier, [0] * 6)
                for j, v in enumerate((t.blocks, t.bytes, t.capacity_bytes, t.hits, t.misses, t.evictions)):
                    acc[j] += v
        return StatsResult(
            tiers=[TierStats(tier, *acc) for tier, acc in tiers.items()],
            active_leases=sum(r.active_leases for r in ok),
            expired_blocks=sum(r.expired_blocks for r in ok),
            version=",".join(sorted({r.version for r in ok})),
            timing=_summed((r.timing for r in ok), int((time.monotonic() - start) * 1e6)),
            data_listen="",
        )
