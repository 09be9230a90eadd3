"""The exception every kvtier client call raises (gRPC and data plane alike)."""
from __future__ import annotations

from typing import Any

import grpc

from ._error import Error

__all__ = ["Error", "KvtierError", "status_code"]


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
        code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        details = e.details() if hasattr(e, "details") else str(e)
        err = cls(code or grpc.StatusCode.UNKNOWN, details or "", pushback(e))
        err.__cause__ = e
        return err


# The longest server retry hint a client follows (seconds).
MAX_PUSHBACK = 10.0


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


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def status_code(code: int) -> grpc.StatusCode:
    """The :class:`grpc.StatusCode` numbered ``code`` (``UNKNOWN`` for numbers gRPC does not define)."""
    return _CODES.get(code, grpc.StatusCode.UNKNOWN)
