"""Reads and writes over the data plane, by the Rust client core (``kvtier._native``).

The bytes of every ``read`` / ``write`` that :class:`kvtier.Client` sends
over the data plane are moved by the same code as the Rust client's:
``kvtier._native`` is ``crates/kvtier-client`` built as a Python extension
(``crates/kvtier-py``; ``scripts/build-native.sh``). It releases the GIL for
every call, takes the caller's buffers through the buffer protocol without
copying them, stripes long reads, continues replies cut for size, splits
writes larger than the server takes at once, and is fork-safe. Two
transports:

* the TCP data plane (``docs/wire.md``), every payload's CRC32C verified as
  it arrives;
* the same-host socket (``unix:///path``, ``docs/local.md``), where the
  payloads move through shared memory the server creates (blocks copied
  out of it into the caller's buffers, saves through a segment lent to the
  connection): no payload byte goes through the socket.

This module is the seam: it turns the extension's errors into
:class:`~kvtier.errors.KvtierError` and says whether the extension is there.
Without it (Python < 3.11, or a checkout where ``make native`` has not run)
``Client`` reads and writes over gRPC and logs once why.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .errors import KvtierError, status_code, wire_pushback

_MISSING: ImportError | None
try:
    from . import _native
except ImportError as e:  # the extension is not built here
    _native = None  # type: ignore[assignment]
    _MISSING = e
else:
    _MISSING = None

__all__ = ["DataPlane", "available", "why_unavailable", "parse_addr", "MAX_STRIPES", "STRIPE_MIN_BLOCKS"]

_log = logging.getLogger("kvtier")
T = TypeVar("T")

#: Most stripes per read by default (the Rust client's ``wire::MAX_STRIPES``).
MAX_STRIPES = 8
#: Fewest keys per stripe (the Rust client's ``wire::STRIPE_MIN_BLOCKS``).
STRIPE_MIN_BLOCKS = 8


def available() -> bool:
    """Whether ``kvtier._native`` can be imported here."""
    return _native is not None


def why_unavailable() -> str:
    """Why ``kvtier._native`` cannot be imported ("" when it can)."""
    if _MISSING is None:
        return ""
    return f"{_MISSING} (build it with `make native`, or scripts/build-native.sh; Python >= 3.11)"


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` into ``(host, port)``; ``ValueError`` otherwise."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{addr!r} is not host:port")
    return host.strip("[]"), int(port)


def _errors(fn: Callable[..., T]) -> Callable[..., T]:
    """The extension's ``NativeError(code, message, retry_ms)`` as a :class:`KvtierError`."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except _native.NativeError as e:
            code, message, retry_ms = e.args
            raise KvtierError(status_code(code), message, wire_pushback(retry_ms)) from None

    return wrapped


class DataPlane:
    """A pool of data-plane connections to one server: ``host:port`` (TCP)
    or ``unix:///path`` (the same-host socket).

    ``tls_ca`` / ``tls_cert`` / ``tls_key`` are PEM bytes (TCP only).
    ``max_request`` is the server's ``Stats.max_message_size`` (0: its default).
    """

    @_errors
    def __init__(
        self,
        target: str,
        *,
        connections: int = 4,
        timeout: float = 10.0,
        connect_timeout: float = 5.0,
        token: str | None = None,
        congestion: str | None = None,
        max_stripes: int = MAX_STRIPES,
        max_request: int = 0,
        tls_ca: bytes | None = None,
        tls_cert: bytes | None = None,
        tls_key: bytes | None = None,
        tls_server_name: str | None = None,
    ):
        if _native is None:
            raise KvtierError(status_code(9), f"kvtier._native is not available: {why_unavailable()}")
        self._dp = _native.DataPlane(
            target, connections, timeout, connect_timeout, token, congestion, max_stripes, max_request,
            tls_ca, tls_cert, tls_key, tls_server_name,
        )
        self.connections = connections
        self.max_stripes = max_stripes

    @property
    def transport(self) -> str:
        """``"unix"`` (the same-host socket) or ``"tcp"``."""
        return str(self._dp.transport)

    @property
    def target(self) -> str:
        return str(self._dp.target)

    @property
    @_errors
    def copies_by_memory(self) -> bool:
        """Whether payloads move through shared memory (same-host socket, and the server may share it)."""
        return bool(self._dp.copies_by_memory)

    @_errors
    def read(self, namespace: str, keys: Sequence[bytes], lease_id: int, timeout: float):
        """``(blocks, partial, reason, timing)``; each block ``(index, key, parent, token_count, payload, tier)``,
        its checksum verified."""
        return self._dp.read(namespace, list(keys), lease_id, timeout)

    @_errors
    def read_into(self, namespace: str, keys: Sequence[bytes], lease_id: int, buffers: Sequence[Any],
                  timeout: float):
        """Into ``buffers`` (one writable buffer per key): ``(blocks, partial, reason, timing)``, each block
        ``(index, key, parent, token_count, length, tier)``."""
        return self._dp.read_into(namespace, list(keys), lease_id, list(buffers), timeout)

    @_errors
    def map_read(self, namespace: str, keys: Sequence[bytes], lease_id: int, timeout: float) -> MappedRead:
        """The blocks left in kvtier's shared memory (same-host socket only): see :class:`MappedRead`."""
        return MappedRead(self._dp.map_read(namespace, list(keys), lease_id, timeout))

    @_errors
    def write(self, namespace: str, blocks: Sequence[tuple[bytes, bytes | None, int, Any, int, list[int]]],
              timeout: float):
        """Blocks as ``(key, parent, token_count, payload, ttl_ms, token_ids)``: ``(stored, existing, timing)``."""
        return self._dp.write(namespace, list(blocks), timeout)

    def close(self) -> None:
        self._dp.close()

    def __repr__(self) -> str:
        return f"DataPlane({self.target}, connections={self.connections})"


class MappedRead:
    """A read's blocks left where they are in kvtier's shared memory
    (docs/local.md, "Loads a GPU reads in place"): ``regions`` gives each
    block's ``(address, length)`` in this process, ``segments`` every mapped
    segment's ``(id, address, length)`` (what a GPU engine registers once per
    id with its driver, read-only, and then DMAs each block from:
    :class:`kvtier.pins.HostPins`). The addresses stay valid and their bytes
    unchanged until :meth:`release` (or the end of a ``with`` block); the
    server reuses no slot before."""

    def __init__(self, native: Any) -> None:
        self._m = native

    @property
    @_errors
    def blocks(self) -> list[tuple[int, bytes, bytes | None, int, int, int]]:
        """Blocks found, each ``(index, key, parent, token_count, length, tier)``."""
        return list(self._m.blocks)

    @property
    @_errors
    def partial(self) -> bool:
        return bool(self._m.outcome[0])

    @property
    @_errors
    def reason(self) -> str:
        """``missing``, ``deadline``, ``size`` (read the rest with another call) or empty."""
        return str(self._m.outcome[1])

    @property
    @_errors
    def regions(self) -> list[tuple[int, int]]:
        return list(self._m.regions)

    @property
    @_errors
    def segments(self) -> list[tuple[int, int, int]]:
        return list(self._m.segments)

    @_errors
    def copy_into(self, i: int, buffer: Any) -> int:
        """Copies block ``i`` into a writable buffer; its length."""
        return int(self._m.copy_into(i, buffer))

    @_errors
    def release(self) -> None:
        self._m.release()

    def __enter__(self) -> MappedRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
