"""Pieces both halves of the connector use: the metadata the scheduler sends
to the workers, chain keys of vLLM requests, a circuit breaker that keeps a
dead kvtier from costing a timeout per request, and the stats log."""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import grpc

from .. import keys as _keys
from ..errors import KvtierError

__all__ = ["LoadSpec", "SaveSpec", "Breaker", "StatsLog", "chain_keys", "is_outage", "show_info_lines"]

log = logging.getLogger("kvtier.vllm")


def show_info_lines() -> None:
    """Makes the connector's INFO lines (which kvtier, which transport) reach
    the engine's log. vLLM configures only its own ``vllm`` logger, so in an
    engine process nothing handles ``kvtier.vllm`` below WARNING. Where the
    process has no logging set up at all (no root handler), the connector
    gets a handler of its own; an application or a test that configured
    logging keeps its set-up."""
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [kvtier] %(message)s", "%m-%d %H:%M:%S"))
    log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)


@dataclass
class LoadSpec:
    """Read ``keys`` into vLLM blocks ``block_ids`` (same length, chain order)."""

    req_id: str
    keys: list[bytes]
    block_ids: list[int]
    #: namespace -> lease id taken by the scheduler's Lookup (0: none).
    leases: dict[str, int] = field(default_factory=dict)
    #: namespace -> the cluster node that granted its lease (a node-list url
    #: only): the worker's own client never saw the Lookup.
    lease_nodes: dict[str, str] = field(default_factory=dict)
    is_async: bool = False
    #: The KV-cache group whose blocks these are (hybrid models; docs/vllm.md).
    group: int = 0


@dataclass
class SaveSpec:
    """Store vLLM blocks ``block_ids`` under ``keys``; ``parent`` is the key before ``keys[0]``."""

    req_id: str
    keys: list[bytes]
    block_ids: list[int]
    parent: bytes | None
    #: The KV-cache group whose blocks these are (hybrid models; docs/vllm.md).
    group: int = 0
    #: Whether each block names the one before it as its parent. A window
    #: group's blocks are stored unlinked: kvtier evicts a chain from its
    #: tail, which would drop the window (the blocks a hit reads) before
    #: the head nobody reads; unlinked, each goes by its own last use.
    chained: bool = True
    #: The token ids of ``keys``' blocks, one block after another, for
    #: kvtier's KV events (docs/events.md); empty: none sent.
    tokens: list[int] = field(default_factory=list)


def chain_keys(
    tokens, block_size: int, salt: str | None = None, start: int = 0, prev: bytes | None = None, key_salt: bytes = b""
) -> list[bytes]:
    """Keys (``xxh3-64-v1``, docs/keys.md) of the full blocks of ``tokens``
    from block ``start`` on, continuing from ``prev`` (the key of block
    ``start - 1``). A request's ``cache_salt`` seeds the chain, so salted
    requests never share keys with unsalted ones or other salts. A deployment's
    secret ``key_salt`` (``$KVTIER_KEY_SALT``) seeds it too: the chain is then
    salted with ``key_salt + b"\0" + cache_salt`` (docs/keys.md), so nobody
    without the secret can compute, and pre-write, these keys."""
    if start == 0:
        prev = None
        if key_salt:
            prev = _keys.seed(bytes(key_salt) + b"\0" + (salt or "").encode())
        elif salt:
            import xxhash

            prev = xxhash.xxh3_64_intdigest(b"kvtier-vllm-salt-v1\0" + salt.encode()).to_bytes(8, "big")
    out = []
    n = len(tokens) // block_size
    for i in range(start, n):
        prev = _keys.block_key(prev, tokens[i * block_size:(i + 1) * block_size])
        out.append(prev)
    return out


def is_outage(err: BaseException) -> bool:
    """True for errors that mean "kvtier is not answering" (count towards the
    breaker), False for errors about one request (a missing lease, a bad block)."""
    if isinstance(err, KvtierError):
        return err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN)
    return isinstance(err, (OSError, TimeoutError))


class Breaker:
    """Fails fast while kvtier is unreachable.

    After a failure, calls are refused (``allow()`` is False) for a pause that
    starts at ``initial`` seconds and doubles up to ``maximum``; the first
    call after the pause goes through as a probe. One WARNING when kvtier
    becomes unreachable and one INFO when it answers again, however many
    requests pass in between.
    """

    def __init__(self, what: str, initial: float, maximum: float):
        self.what = what
        self.initial = initial
        self.maximum = maximum
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._pause = initial
        self._retry_at = 0.0
        self.failures = 0

    def allow(self) -> bool:
        with self._lock:
            return self._down_since is None or time.monotonic() >= self._retry_at

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def success(self) -> None:
        with self._lock:
            if self._down_since is not None:
                log.info("kvtier at %s answers again after %.1f s; using it", self.what, time.monotonic() - self._down_since)
            self._down_since = None
            self._pause = self.initial

    def failure(self, err: BaseException) -> None:
        with self._lock:
            self.failures += 1
            now = time.monotonic()
            if self._down_since is None:
                self._down_since = now
                self._pause = self.initial
                log.warning(
                    "kvtier at %s is unreachable (%s); the engine serves without it (every prefix is "
                    "recomputed) and retries in %.3g s, backing off to %.3g s",
                    self.what, err, self._pause, self.maximum,
                )
            else:
                log.debug("kvtier at %s still unreachable: %s", self.what, err)
                self._pause = min(self._pause * 2, self.maximum)
            self._retry_at = now + self._pause


class StatsLog:
    """Appends one JSON object per line to ``path`` (no-op without a path).

    Lines are written with one ``write`` on an ``O_APPEND`` descriptor, so the
    scheduler and worker processes can share one file."""

    def __init__(self, path: str, role: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None
        self._role = role
        self._pid = os.getpid()

    def __call__(self, event: str, **fields) -> None:
        if self._fd is None:
            return
        rec = {"t": round(time.time(), 6), "pid": self._pid, "role": self._role, "event": event, **fields}
        try:
            os.write(self._fd, (json.dumps(rec, default=str) + "\n").encode())
        except OSError as e:  # a full disk must not take the engine down
            log.debug("kvtier stats_file write failed: %s", e)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
