"""How a client reaches one server over gRPC: the address forms it takes,
the bearer token and TLS settings with their ``$KVTIER_*`` fallbacks, and the
pool of channels it opens (docs/security.md).

:func:`open_channels` turns the constructor's connection arguments into
:class:`Channels`: ``connections`` separate HTTP/2 connections (one TCP
stream caps throughput), secured and authenticated as asked. The same TLS
settings, as PEM bytes, secure the data plane (:mod:`kvtier.discovery`).
"""
from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

import grpc

__all__ = ["Channels", "open_channels", "grpc_target", "local_path", "check_listener", "MAX_MESSAGE_SIZE"]

#: Largest gRPC message sent or received (matches the Rust client).
MAX_MESSAGE_SIZE = 512 << 20


def local_path(t: str) -> str | None:
    """The socket path of a ``unix:///path`` (or ``unix:/path``) target."""
    for scheme in ("unix://", "unix:"):
        if t.startswith(scheme):
            return t[len(scheme):]
    return None


def grpc_target(t: str) -> str:
    """``t`` as grpcio dials it: ``host:port`` without an ``http://``,
    ``grpc://`` or ``https://`` prefix, or ``unix:PATH``."""
    local = local_path(t)
    if local is not None:
        return f"unix:{local}"
    for scheme in ("http://", "grpc://", "https://"):
        if t.startswith(scheme):
            t = t[len(scheme):]
    return t.rstrip("/")


def check_listener(path: str) -> None:
    """Refuses (``PermissionError``) a same-host socket whose listener runs
    as neither this process's uid, root nor ``$KVTIER_SERVER_UID``: the token
    would go to whoever bound the path (docs/security.md). The Rust core
    checks its own connections the same way; grpcio dials by itself, so this
    checks the listener once, before the channels open. A path nobody
    listens on is left to grpcio to report."""
    want = os.environ.get("KVTIER_SERVER_UID", "").strip()
    try:
        expected = int(want) if want else None
    except ValueError:
        raise ValueError(f"KVTIER_SERVER_UID={want!r}: expected the numeric uid the kvtier server runs as") from None
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        _pid, uid, _gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return
    finally:
        s.close()
    if uid not in (0, os.geteuid(), expected):
        raise PermissionError(
            f"unix://{path}: the process listening on this socket runs as uid {uid}, not as this "
            f"process's uid, root or the expected server uid; refusing to send it anything, the "
            f"token included. Set KVTIER_SERVER_UID={uid} if kvtier runs as that uid (docs/security.md)"
        )


@dataclass
class Channels:
    """The open channel pool and the security settings it was opened with."""

    channels: list[grpc.Channel]
    token: str | None
    """The bearer token (``None``: none)."""
    tls_pems: tuple[bytes | None, bytes | None, bytes | None] | None
    """The CA bundle, client certificate and key as PEM bytes, for the native
    core's data-plane connections (``None``: no TLS)."""
    tls_name: str
    """The name the server's certificate is checked against."""


def _env(value: str | None, name: str) -> str | None:
    """``value`` if given, else ``$name``; an empty setting is none."""
    return value if value is not None else os.environ.get(name) or None


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def open_channels(
    target: str,
    connections: int,
    token: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_server_name: str | None = None,
) -> Channels:
    """Opens ``connections`` channels to ``target`` (as given to the client).

    ``token`` defaults to ``$KVTIER_TOKEN``, ``tls_ca`` / ``tls_cert`` /
    ``tls_key`` to ``$KVTIER_TLS_CA`` / ``$KVTIER_TLS_CERT`` /
    ``$KVTIER_TLS_KEY``. TLS is on with a CA bundle, or with the system's
    roots for an ``https://`` target; never on the same-host socket.
    ``ValueError`` for settings that do not go together.
    """
    dial = grpc_target(target)
    local = local_path(target)
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
        # Without this, channels with equal arguments share one subchannel
        # (one TCP connection) through the global subchannel pool.
        ("grpc.use_local_subchannel_pool", 1),
        # Retries are done by the client (kvtier.retry), with its own deadline accounting.
        ("grpc.enable_retries", 0),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        # gRPC's default reconnect back-off grows to 120 s: a restarted
        # server would stay unused for up to two minutes.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]
    if local is not None:
        # grpcio would send the socket's path as :authority, which HTTP/2
        # servers refuse.
        options.append(("grpc.default_authority", "localhost"))
        check_listener(local)
    if token is None:
        token = os.environ.get("KVTIER_TOKEN") or None
    tls_ca = _env(tls_ca, "KVTIER_TLS_CA")
    tls_cert = _env(tls_cert, "KVTIER_TLS_CERT")
    tls_key = _env(tls_key, "KVTIER_TLS_KEY")
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together")
    want_tls = bool(tls_ca) or target.startswith("https://")
    if tls_cert and not want_tls:
        raise ValueError("a client certificate needs tls_ca (TLS is off without it)")
    if want_tls and local is not None:
        raise ValueError("TLS is not used on the same-host socket (unix://): drop the TLS settings")
    pems: tuple[bytes | None, bytes | None, bytes | None] | None = None
    if want_tls:
        ca_pem = _read(tls_ca) if tls_ca else None
        cert_pem = key_pem = None
        if tls_cert:
            assert tls_key is not None  # they go together (checked above)
            cert_pem, key_pem = _read(tls_cert), _read(tls_key)
        creds = grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem)
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        channels = [grpc.secure_channel(dial, creds, options=options) for _ in range(connections)]
        pems = (ca_pem, cert_pem, key_pem)
    else:
        channels = [grpc.insecure_channel(dial, options=options) for _ in range(connections)]
    if token:
        auth = _BearerInterceptor(token)
        channels = [grpc.intercept_channel(ch, auth) for ch in channels]
    return Channels(channels, token, pems, tls_server_name or dial.rsplit(":", 1)[0].strip("[]"))


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
