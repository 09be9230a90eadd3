"""kvtier: Python SDK for the kvtier KV-cache block store.

* :mod:`kvtier.keys` — the chained block-key scheme (no gRPC needed).
* :class:`kvtier.Client` — pooled ``kvtier.v1`` gRPC client (:mod:`kvtier.client`);
  given several addresses, a :class:`kvtier.ClusterClient` (:mod:`kvtier.cluster`).
  Its calls take and return the types of :mod:`kvtier.results`; failures raise
  :class:`kvtier.KvtierError` (:mod:`kvtier.errors`).
* :class:`kvtier.HttpClient` — stdlib client for the HTTP key/value API.
* :class:`kvtier.Server` — starts the real binary (tests, examples).
* :mod:`kvtier.pb` — the generated protobuf/gRPC modules.

gRPC-dependent names are imported lazily, so ``import kvtier.keys`` does not
load grpc or generate stubs.
"""
from __future__ import annotations

import importlib

from .errors import Error
from .keys import chain

__version__ = "0.1.0"

_LAZY = {
    "Client": "client",
    "ClusterClient": "cluster",
    "KvtierError": "errors",
    "Tier": "results",
    "ServerTiming": "results",
    "Block": "results",
    "LookupResult": "results",
    "TierCount": "results",
    "ReadBlock": "results",
    "ReadResult": "results",
    "WriteResult": "results",
    "DeleteResult": "results",
    "LeaseResult": "results",
    "StatsResult": "results",
    "TierStats": "results",
    "HttpClient": "http",
    "HttpError": "http",
    "Server": "server",
    "ServerError": "server",
}

__all__ = ["Error", "chain", "__version__"]
__all__ += list(_LAZY)


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'kvtier' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
