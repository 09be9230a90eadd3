"""The connector's settings: ``kv_connector_extra_config`` parsed and checked.

Every key is documented in ``docs/vllm.md``. Unknown keys are refused at
engine start (a typo would otherwise silently keep a default), and so are
values of the wrong type or range: the engine then fails to start with a
message that names the key, which is better than serving without the cache
the operator asked for.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["ConnectorConfig", "LOAD_MODES"]

#: ``sync``: blocks are read and copied into vLLM's cache before the forward
#: pass that needs them. ``async``: the request waits (off the batch) while a
#: worker thread loads, other requests keep running. ``layerwise``: the read
#: starts before the forward pass and each layer is copied in just before its
#: attention runs.
LOAD_MODES = ("sync", "async", "layerwise")

_NAMESPACE_PREFIX = re.compile(r"^[A-Za-z0-9._:/-]{0,48}$")


@dataclass(frozen=True)
class ConnectorConfig:
    """Settings of :class:`kvtier.vllm.KvtierConnector` (``kv_connector_extra_config``)."""

    url: str
    """kvtier's gRPC address, ``host:port`` (``grpc://`` accepted). Required."""
    namespace_prefix: str = ""
    """Put in front of the derived namespace, e.g. a tenant (``acme/``)."""
    model_id: str = ""
    """Overrides the model identity that goes into the namespace (default: the
    model's name or path, revision, config and a fingerprint of local weights)."""
    load_mode: str = "sync"
    """One of :data:`LOAD_MODES` (see notes/*-vllm-ttft.md for why ``sync``)."""
    load_in_place: str = "auto"
    """Where a cache's layers allow it (a contiguous CPU cache), reads land
    straight in vLLM's cache, a region per layer, with no staging copy:
    ``auto`` on kvtier's same-host socket only (over TCP, in place measured
    no faster inside the engine, notes/050), ``always``, or ``never``."""
    load_mapped: str = "auto"
    """On a GPU, reads on kvtier's same-host socket stay in kvtier's shared
    memory (``Client.map_read``), which is pinned once and DMA'd from
    straight into vLLM's cache, with no staging copy: ``auto`` (a CUDA cache
    on the same-host socket), ``always`` (any device: on the CPU one copy
    from the mapping) or ``never``."""
    lookup_timeout_ms: int = 500
    """Longest the scheduler waits for a Lookup; past it the request gets 0 external tokens."""
    load_timeout_ms: int = 10_000
    """Deadline of one request's block read; past it the blocks are recomputed."""
    save_timeout_ms: int = 10_000
    """Deadline of one background write."""
    lease_ms: int = 30_000
    """How long a Lookup pins the found prefix (released early once read)."""
    max_pending_save_mib: int = 1024
    """Saves waiting to be sent are capped at this many MiB; beyond, new saves
    are dropped (a later miss), never allowed to stall the forward pass."""
    retry_initial_ms: int = 1_000
    """After kvtier fails to answer, calls are skipped for this long, doubling..."""
    retry_max_ms: int = 30_000
    """...up to this long; the first call after the pause probes it again."""
    connections: int = 2
    """Connections per process (gRPC channels, data-plane sockets)."""
    data_plane: bool = True
    """Send block reads/writes over kvtier's bulk data plane when it offers one."""
    save_decode_blocks: bool = True
    """Also store blocks filled by generated tokens (multi-turn reuse)."""
    send_token_ids: bool = True
    """Send each full-attention block's token ids with it, so kvtier's KV
    events can name them to routers (docs/events.md). The server keeps them
    only while the block is resident and only with ``[events]`` on; requests
    with a ``cache_salt`` never send theirs."""
    load_failure_policy: str = "recompute"
    """``recompute`` (failed loads are recomputed: same output, slower) or
    ``fail`` (vLLM's default: the request ends with an error)."""
    stats_file: str = ""
    """If set, one JSON line per lookup, load and save is appended here."""

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> ConnectorConfig:
        """Parses ``kv_connector_extra_config``; raises ``ValueError`` naming the bad key."""
        extra = dict(extra or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ValueError(
                f"kvtier connector: unknown kv_connector_extra_config key(s) {unknown}; "
                f"known: {sorted(known)} (docs/vllm.md)"
            )
        if not extra.get("url"):
            raise ValueError('kvtier connector: kv_connector_extra_config needs "url": "HOST:PORT" of a kvtier server')
        values: dict[str, Any] = {}
        for name, value in extra.items():
            default = known[name].default
            kind: type = type(default) if name != "url" else str
            if kind is bool:
                if not isinstance(value, bool):
                    raise ValueError(f"kvtier connector: {name} must be true or false, not {value!r}")
            elif kind is int:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"kvtier connector: {name} must be a non-negative integer, not {value!r}")
            elif not isinstance(value, str):
                raise ValueError(f"kvtier connector: {name} must be a string, not {value!r}")
            values[name] = value
        cfg = cls(**values)
        cfg._check()
        return cfg

    def _check(self) -> None:
        if self.load_mode not in LOAD_MODES:
            raise ValueError(f"kvtier connector: load_mode must be one of {LOAD_MODES}, not {self.load_mode!r}")
        if self.load_in_place not in ("auto", "always", "never"):
            raise ValueError(
                f'kvtier connector: load_in_place must be "auto", "always" or "never", not {self.load_in_place!r}'
            )
        if self.load_mapped not in ("auto", "always", "never"):
            raise ValueError(
                f'kvtier connector: load_mapped must be "auto", "always" or "never", not {self.load_mapped!r}'
            )
        if self.load_failure_policy not in ("recompute", "fail"):
            raise ValueError(
                f'kvtier connector: load_failure_policy must be "recompute" or "fail", not {self.load_failure_policy!r}'
            )
        if not _NAMESPACE_PREFIX.match(self.namespace_prefix):
            raise ValueError(
                "kvtier connector: namespace_prefix must be at most 48 characters of [A-Za-z0-9._:/-], "
                f"not {self.namespace_prefix!r}"
            )
        for name in ("lookup_timeout_ms", "load_timeout_ms", "save_timeout_ms", "connections", "retry_initial_ms"):
            if getattr(self, name) == 0:
                raise ValueError(f"kvtier connector: {name} must be > 0")
        if self.retry_max_ms < self.retry_initial_ms:
            raise ValueError("kvtier connector: retry_max_ms must be >= retry_initial_ms")
        if self.lease_ms > 0xFFFFFFFF:
            raise ValueError("kvtier connector: lease_ms must fit in 32 bits")
