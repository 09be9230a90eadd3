"""Which transport a client's reads and writes take: the same-host socket,
the TCP data plane, or gRPC. Chosen once, on the first read or write, as the
Rust client chooses (docs/local.md, docs/wire.md):

1. a ``unix://PATH`` target: its socket;
2. the socket the server advertises (``Stats.local_listen``), when it exists
   here and leads back to the same server (``Stats.instance_id``): a socket
   at that path may be another kvtier's;
3. the data plane it advertises (``Stats.data_listen``; an unspecified host
   is replaced by the gRPC target's), unless it cannot be reached (a
   container that publishes only the gRPC port): then gRPC, with a warning;
4. else gRPC; also in a Python without ``kvtier._native``.

The choice is logged once (logger ``kvtier``). Errors of the ``Stats`` call,
and a data plane that refuses the token, propagate, and the choice is made
again on the next call.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

import grpc

from . import dataplane as _dp
from .errors import KvtierError
from .results import StatsResult

__all__ = ["DataPlaneChoice", "data_plane_addr"]

_log = logging.getLogger("kvtier")


def data_plane_addr(target: str, advertised: str) -> tuple[str, int]:
    """Where to dial the data plane: the advertised address, with an
    unspecified host (``0.0.0.0``, ``::``) replaced by the gRPC target's host."""
    host, port = _dp.parse_addr(advertised)
    if host in ("0.0.0.0", "::", ""):
        try:
            host = _dp.parse_addr(target)[0]
        except ValueError:
            host = "127.0.0.1"
    return host, port


class DataPlaneChoice:
    """The data plane of one client, found on first use (thread-safe).

    :param target: the gRPC target as dialled (``host:port``, ``unix:PATH``).
    :param local: the socket path of a ``unix://`` target, else ``None``.
    :param enabled: ``False``: always gRPC, no discovery call.
    :param same_host: whether to move to an advertised same-host socket.
    :param pb: the generated modules (``kvtier.pb``), to ask the socket's server who it is.
    :param tls_pems: ``(ca, cert, key)`` PEM bytes for a TLS data plane (``None``: plain TCP).
    Other parameters: as :class:`kvtier.dataplane.DataPlane` takes them.
    """

    def __init__(self, target: str, local: str | None, *, enabled: bool, same_host: bool, pb: Any,
                 connections: int, timeout: float, token: str | None, max_stripes: int,
                 congestion: str | None, tls_pems: tuple[bytes | None, bytes | None, bytes | None] | None,
                 tls_name: str):
        self.target = target
        self.local = local
        self.same_host = same_host
        self._pb = pb
        self._token = token
        self._timeout = timeout
        self._connections = connections
        self._max_stripes = max_stripes
        self._congestion = congestion
        self._tls_pems = tls_pems
        self._tls_name = tls_name
        #: The pool in use (``None``: gRPC); meaningful once ``known``.
        self.pool: _dp.DataPlane | None = None
        #: Whether the choice has been made.
        self.known = not enabled
        self._lock = threading.Lock()

    def get(self, stats: Callable[[], StatsResult]) -> _dp.DataPlane | None:
        """The pool reads and writes use, choosing it with ``stats()`` (the
        server's ``Stats``) the first time; ``None``: gRPC."""
        if self.known:
            return self.pool
        with self._lock:
            if not self.known:
                self.pool = self._discover(stats)
                self.known = True
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def _discover(self, stats: Callable[[], StatsResult]) -> _dp.DataPlane | None:
        if not _dp.available():
            _log.warning("kvtier transport: gRPC for reads and writes of %s (%s)", self.target, _dp.why_unavailable())
            return None
        st = stats()
        common: dict[str, Any] = dict(
            connections=self._connections, timeout=self._timeout, token=self._token,
            max_stripes=self._max_stripes, max_request=st.max_message_size,
        )
        if self.local is not None:
            pool: _dp.DataPlane | None = _dp.DataPlane(f"unix://{self.local}", **common)
            _log.info("kvtier transport: same-host socket %s (given), payloads through shared memory", self.local)
            return pool
        if self.same_host and st.local_listen and os.path.exists(st.local_listen):
            upgraded = self._upgrade(st, common)
            if upgraded is not None:
                return upgraded
        if not st.data_listen:
            _log.info("kvtier transport: gRPC (%s offers no data plane)", self.target)
            return None
        host, port = data_plane_addr(self.target, st.data_listen)
        tls: dict[str, Any] = {}
        if self._tls_pems is not None:
            ca, cert, key = self._tls_pems
            tls = dict(tls_ca=ca or b"", tls_cert=cert, tls_key=key, tls_server_name=self._tls_name)
        try:
            pool = _dp.DataPlane(f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                                 congestion=self._congestion, **common, **tls)
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
        """The advertised same-host socket, if it leads back to this server."""
        path = st.local_listen
        try:
            with grpc.insecure_channel(f"unix:{path}", options=[("grpc.default_authority", "localhost")]) as ch:
                md = [("authorization", f"Bearer {self._token}")] if self._token else None
                there = self._pb.v1_grpc.KvTierStub(ch).Stats(self._pb.v1.StatsRequest(), timeout=self._timeout,
                                                              metadata=md)
            if there.instance_id != st.instance_id or not st.instance_id:
                _log.debug("kvtier: the socket %s is another server's", path)
                return None
            pool = _dp.DataPlane(f"unix://{path}", **common)
        except (grpc.RpcError, KvtierError) as e:
            _log.debug("kvtier: the same-host socket %s is not usable from here: %s", path, e)
            return None
        _log.info("kvtier transport: same-host socket %s (advertised by %s), payloads through shared memory",
                  path, self.target)
        return pool
