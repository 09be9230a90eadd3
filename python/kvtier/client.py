"""``kvtier.Client``: the SDK's entry point, for one server or a cluster.

``Client("host:port")`` (or ``unix:///path``) is the client of one server,
a :class:`~kvtier.node.NodeClient` (its parameters are ``Client``'s);
``Client(["h1:p1", "h2:p2"])`` or ``Client("h1:p1,h2:p2")`` returns a
:class:`~kvtier.cluster.ClusterClient` with the same methods (docs/cluster.md).

Why the choice is made here: a cluster client is built from one node client
per address, so :mod:`kvtier.cluster` imports :mod:`kvtier.node`. Were the
dispatch in the node client itself, the two modules would import each other.
This module imports both and is imported by neither, so the import graph stays
a tree: ``client -> cluster -> node``, ``client -> node``.

It also re-exports the result types and :class:`KvtierError`, so
``from kvtier.client import Block, Client, KvtierError`` keeps working.

>>> from kvtier import Client
>>> with Client("127.0.0.1:50051") as c:                     # doctest: +SKIP
...     c.write_tokens("my-model", tokens, payloads)
...     print(c.lookup("my-model", tokens=tokens).found)
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .channels import MAX_MESSAGE_SIZE
from .cluster import ClusterClient
from .errors import KvtierError
from .node import NodeClient
from .results import (
    Block,
    DeleteResult,
    LeaseResult,
    LookupResult,
    ReadBlock,
    ReadResult,
    ServerTiming,
    StatsResult,
    Tier,
    TierStats,
    WriteResult,
    token_chain,
)

__all__ = [
    "Client",
    "ClusterClient",
    "NodeClient",
    "KvtierError",
    "Tier",
    "ServerTiming",
    "Block",
    "LookupResult",
    "ReadBlock",
    "ReadResult",
    "WriteResult",
    "DeleteResult",
    "LeaseResult",
    "TierStats",
    "StatsResult",
    "MAX_MESSAGE_SIZE",
    "token_chain",
]


class Client(NodeClient):
    """A pooled, thread-safe ``kvtier.v1`` client: :class:`~kvtier.node.NodeClient`
    for one address, whose parameters it takes.

    Given a list of addresses, or one string of comma-separated addresses,
    ``Client(...)`` returns a :class:`~kvtier.cluster.ClusterClient` instead
    (one client per node, built with the other arguments, plus ``replicas=``
    and ``down_for=``; docs/cluster.md). That object is not a ``Client``, so
    Python does not run ``__init__`` on it.
    """

    def __new__(cls, target: str | Sequence[str] = "127.0.0.1:50051", *args: Any, **kwargs: Any) -> Any:
        if cls is Client and (not isinstance(target, str) or "," in target):
            return ClusterClient(target, *args, **kwargs)
        return super().__new__(cls)
