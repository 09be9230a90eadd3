"""The exceptions kvtier raises: one root, :class:`Error`, and
:class:`KvtierError` for a failed call (gRPC and data plane alike).

``except kvtier.Error`` catches every failure of the SDK and nothing else:
``KvtierError`` here, ``HttpError`` (:mod:`kvtier.http`), ``ServerError``
(:mod:`kvtier.server`) and ``ProtoError`` (:mod:`kvtier._proto`) derive from
it. Importing this module does not import grpc (``kvtier/__init__`` and the
grpc-free modules ``keys``, ``http`` and ``server`` use :class:`Error`), so
the helpers that need :class:`grpc.StatusCode` import it when called.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc

__all__ = ["Error", "KvtierError", "status_code", "pushback", "wire_pushback", "MAX_PUSHBACK"]

# The longest server retry hint a client follows (seconds).
MAX_PUSHBACK = 10.0


class Error(Exception):
    """Anything kvtier raises: ``except kvtier.Error`` catches every failure of
    the SDK (gRPC and data-plane calls, the HTTP client, starting a server,
    generating stubs) and nothing else."""


class KvtierError(Error):
    """A call failed: the server's status, or a client-side check (checksum, deadline).

    ``code`` is a :class:`grpc.StatusCode`; ``message`` the status message;
    ``retry_after``: for a request the server shed, the seconds it asked the
    client to wait before retrying (``grpc-retry-pushback-ms``, or the data
    plane's error frame), else ``None``.
    """

    def __init__(self, code: grpc.StatusCode, message: str, retry_after: float | None = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after

    @classmethod
    def from_rpc(cls, e: grpc.RpcError) -> KvtierError:
        import grpc

        code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        details = e.details() if hasattr(e, "details") else str(e)
        err = cls(code or grpc.StatusCode.UNKNOWN, details or "", pushback(e))
        err.__cause__ = e
        return err


def pushback(e: grpc.RpcError) -> float | None:
    """The retry hint (seconds) in a failed call's trailing metadata, at most
    :data:`MAX_PUSHBACK`; ``None`` without a valid one."""
    # (key, value) pairs; grpc's stubs type them as an opaque class.
    trailers: Any = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == "grpc-retry-pushback-ms":
            try:
                ms = int(value)
            except (TypeError, ValueError):
                return None
            return min(ms / 1000, MAX_PUSHBACK) if ms > 0 else None
    return None


def wire_pushback(ms: int) -> float | None:
    """The data plane's retry hint (its error frames' ``retry_pushback_ms``; 0: none)."""
    return min(ms / 1000, MAX_PUSHBACK) if ms > 0 else None


def status_code(code: int) -> grpc.StatusCode:
    """The :class:`grpc.StatusCode` numbered ``code`` (``UNKNOWN`` for numbers gRPC does not define)."""
    import grpc

    for c in grpc.StatusCode:
        if c.value[0] == code:
            return c
    return grpc.StatusCode.UNKNOWN
