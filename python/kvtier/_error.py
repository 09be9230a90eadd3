"""The root of every exception kvtier raises (no gRPC import, so the
grpc-free modules can use it too)."""
from __future__ import annotations

__all__ = ["Error"]


class Error(Exception):
    """Anything kvtier raises: ``except kvtier.Error`` catches every failure of
    the SDK (gRPC and data-plane calls, the HTTP client, starting a server,
    generating stubs) and nothing else."""
