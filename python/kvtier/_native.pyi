# Types of kvtier._native (crates/kvtier-py/src/lib.rs), the Rust client core
# as an extension module. Kept by hand beside the code it describes; mypy
# checks kvtier.dataplane, its only user, against it.
from collections.abc import Sequence
from typing import Any

MAX_STRIPES: int
STRIPE_MIN_BLOCKS: int

class NativeError(Exception):
    """args: (grpc status code as int, message, retry hint in ms or 0)."""

_Timing = dict[str, int]

class MappedRead:
    @property
    def blocks(self) -> list[tuple[int, bytes, bytes | None, int, int, int]]: ...
    @property
    def outcome(self) -> tuple[bool, str]: ...
    @property
    def regions(self) -> list[tuple[int, int]]: ...
    @property
    def segments(self) -> list[tuple[int, int, int]]: ...
    def copy_into(self, i: int, buffer: Any) -> int: ...
    def release(self) -> None: ...

class DataPlane:
    def __init__(
        self,
        target: str,
        connections: int = 4,
        timeout: float = 10.0,
        connect_timeout: float = 5.0,
        token: str | None = None,
        congestion: str | None = None,
        max_stripes: int = 8,
        max_request: int = 0,
        tls_ca: bytes | None = None,
        tls_cert: bytes | None = None,
        tls_key: bytes | None = None,
        tls_server_name: str | None = None,
    ) -> None: ...
    @property
    def transport(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def copies_by_memory(self) -> bool: ...
    def map_read(self, namespace: str, keys: Sequence[bytes], lease_id: int = 0, timeout: float = 10.0) -> MappedRead: ...
    def read_into(
        self, namespace: str, keys: Sequence[bytes], lease_id: int, buffers: Sequence[Any], timeout: float
    ) -> tuple[list[tuple[int, bytes, bytes | None, int, int, int]], bool, str, _Timing]: ...
    def read(
        self, namespace: str, keys: Sequence[bytes], lease_id: int, timeout: float
    ) -> tuple[list[tuple[int, bytes, bytes | None, int, bytes, int]], bool, str, _Timing]: ...
    def write(
        self, namespace: str, blocks: Sequence[tuple[bytes, bytes | None, int, Any, int, list[int]]],
        timeout: float,
    ) -> tuple[int, int, int, _Timing]: ...
    def close(self) -> None: ...
