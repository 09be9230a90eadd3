"""The exception every kvtier client call raises (gRPC and data plane alike)."""
from __future__ import annotations

import grpc

from ._error import Error

__all__ = ["Error", "KvtierError", "status_code"]


class KvtierError(Error):
    """A call failed: the server's status, or a client-side check (checksum, deadline).

    ``code`` is a :class:`grpc.StatusCode`; ``message`` the status message.
    """

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, e: grpc.RpcError) -> KvtierError:
        code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        details = e.details() if hasattr(e, "details") else str(e)
        err = cls(code or grpc.StatusCode.UNKNOWN, details or "")
        err.__cause__ = e
        return err


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def status_code(code: int) -> grpc.StatusCode:
    """The :class:`grpc.StatusCode` numbered ``code`` (``UNKNOWN`` for numbers gRPC does not define)."""
    return _CODES.get(code, grpc.StatusCode.UNKNOWN)
