"""kvtier for vLLM: ``KvtierConnector``, a v1 KV connector (``docs/vllm.md``).

Importing this package does not import vLLM; the connector class is loaded
on first access (vLLM does ``getattr(import_module("kvtier.vllm"), "KvtierConnector")``).
"""
from __future__ import annotations

__all__ = ["KvtierConnector", "KvtierMetadata", "ConnectorConfig"]


def __getattr__(name: str):
    if name in ("KvtierConnector", "KvtierMetadata"):
        from . import connector

        return getattr(connector, name)
    if name == "ConnectorConfig":
        from .config import ConnectorConfig

        return ConnectorConfig
    raise AttributeError(f"module 'kvtier.vllm' has no attribute {name!r}")
