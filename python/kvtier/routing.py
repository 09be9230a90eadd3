"""How a cluster call's parts reach the nodes (docs/cluster.md): which nodes
are up, who owns each key, running the nodes' parts in parallel, and sending
a part that got no answer to the key's next owner.

:class:`Router` holds the per-node clients and the one piece of state a
cluster client keeps: which nodes did not answer lately (skipped for
``down_for`` seconds, unless every node is). :mod:`kvtier.cluster` builds
each call on it and puts the answers back together.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as _wait
from functools import partial
from typing import Callable, TypeVar, Union

import grpc

from . import keys as _keys
from .errors import KvtierError
from .node import NodeClient

__all__ = ["Router", "unreachable"]

T = TypeVar("T")

#: What one node's part of a call gave: its answer, or the error it raised.
Outcome = Union[T, KvtierError]


def unreachable(e: KvtierError) -> bool:
    """The node did not answer (as opposed to answering with an error). A
    node that shed the request (UNAVAILABLE with a retry hint) answered: it
    is up but busy, and sending its part to the next owner would only spread
    the overload."""
    if e.retry_after is not None:
        return False
    return e.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class Router:
    """The nodes of a cluster (``clients``: node name -> its client, in the
    order given) and how a call's parts are sent to them.

    ``down_for``: seconds a node that did not answer is skipped; ``timeout``:
    the default deadline of a call (seconds).
    """

    def __init__(self, clients: dict[str, NodeClient], down_for: float, timeout: float):
        self.clients = clients
        self.nodes = list(clients)
        self.down_for = down_for
        self.timeout = timeout
        self._down: dict[str, float] = {}  # node -> time.monotonic() until which it is skipped
        self._lock = threading.Lock()
        # A call runs one node's part itself and the others here; several
        # callers at once share the pool, hence more threads than nodes.
        self._pool = ThreadPoolExecutor(max_workers=4 * len(self.nodes), thread_name_prefix="kvtier-cluster")

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
        self._pool.shutdown(wait=True)

    def down(self) -> list[str]:
        """The nodes skipped now, because they did not answer lately."""
        now = time.monotonic()
        with self._lock:
            return [n for n in self.nodes if self._down.get(n, 0.0) > now]

    def mark(self, node: str, answered: bool) -> None:
        """Notes whether ``node`` answered: one that did not is skipped for ``down_for`` seconds."""
        with self._lock:
            if answered:
                self._down.pop(node, None)
            else:
                self._down[node] = time.monotonic() + self.down_for

    def deadline(self, timeout: float | None) -> float:
        """The ``time.monotonic()`` by which a call given ``timeout`` (default the client's) must end."""
        budget = self.timeout if timeout is None else float(timeout)
        if budget <= 0:
            raise ValueError("timeout must be > 0")
        return time.monotonic() + budget

    @staticmethod
    def remaining(deadline: float, start: float) -> float:
        """Seconds left before ``deadline``; ``DEADLINE_EXCEEDED`` when none are."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise KvtierError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {deadline - start:.3f}s")
        return left

    @staticmethod
    def pick(ranked: list[str], down: set[str], failed: set[str], skip: Iterable[str] = ()) -> str | None:
        """The first node of ``ranked`` not ``down``, not failed in this call
        and not in ``skip``; else the first one down (a last resort)."""
        fallback = None
        for n in ranked:
            if n in failed or n in skip:
                continue
            if n not in down:
                return n
            if fallback is None:
                fallback = n
        return fallback

    def run(self, calls: Mapping[str, Callable[[], T]]) -> list[tuple[str, Outcome[T]]]:
        """Runs each node's call (in parallel when there are several); a
        ``KvtierError`` is returned as the outcome, other errors raised once
        all calls are done. Nodes are marked up or down by how they answered."""
        items = list(calls.items())
        futs: dict[str, Future[T]] = {node: self._pool.submit(fn) for node, fn in items[1:]}
        outcomes: list[tuple[str, Outcome[T]]] = []
        try:
            node, fn = items[0]
            try:
                outcomes.append((node, fn()))
            except KvtierError as e:
                outcomes.append((node, e))
        finally:
            _wait(futs.values())  # no part left running (into= buffers) when this returns or raises
        for node, f in futs.items():
            err = f.exception()
            if err is not None and not isinstance(err, KvtierError):
                raise err
            outcomes.append((node, err if isinstance(err, KvtierError) else f.result()))
        for node, out in outcomes:
            self.mark(node, not (isinstance(out, KvtierError) and unreachable(out)))
        return outcomes

    def grouped(
        self,
        namespace: str,
        ks: list[bytes],
        send: Callable[[NodeClient, list[int], float], T],
        timeout: float | None,
    ) -> list[T]:
        """Sends each key's part to its first owner (``send(client, indexes
        into ks, seconds left)``), nodes in parallel; the part of a node that
        does not answer goes to the next owner. Returns the nodes' answers."""
        start = time.monotonic()
        deadline = self.deadline(timeout)
        ranks = [_keys.rank(self.nodes, namespace, k) for k in ks]
        failed: set[str] = set()
        last: KvtierError | None = None  # the latest error of a node that did not answer
        pending = list(range(len(ks)))
        answers: list[T] = []
        while pending:
            groups: dict[str, list[int]] = {}
            down = set(self.down())
            for i in sorted(pending):
                node = self.pick(ranks[i], down, failed)
                if node is None:  # every node failed
                    assert last is not None
                    raise last
                groups.setdefault(node, []).append(i)
            left = self.remaining(deadline, start)
            pending = []
            calls = {n: partial(send, self.clients[n], ix, left) for n, ix in groups.items()}
            for node, out in self.run(calls):
                if isinstance(out, KvtierError):
                    if not unreachable(out):
                        raise out
                    failed.add(node)
                    pending += groups[node]
                    last = out
                else:
                    answers.append(out)
        return answers

    def to_first_owner(self, namespace: str, key: bytes | None, call: Callable[[NodeClient, float], T],
                       timeout: float | None = None) -> tuple[str, T]:
        """``call`` on the first owner of ``key`` (of the node list's order
        without a key), then the next ones while they do not answer."""
        start = time.monotonic()
        deadline = self.deadline(timeout)
        ranked = _keys.rank(self.nodes, namespace, key) if key is not None else list(self.nodes)
        failed: set[str] = set()
        last: KvtierError | None = None
        while True:
            node = self.pick(ranked, set(self.down()), failed)
            if node is None:  # every node failed
                assert last is not None
                raise last
            left = self.remaining(deadline, start)
            (_, out), = self.run({node: partial(call, self.clients[node], left)})
            if not isinstance(out, KvtierError):
                return node, out
            if not unreachable(out):
                raise out
            failed.add(node)
            last = out
