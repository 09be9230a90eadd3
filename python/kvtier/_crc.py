"""CRC32C (Castagnoli), the checksum kvtier.v1 puts on every block payload.

Uses the ``crc32c`` package (hardware accelerated) when it is installed and
falls back to a table-driven pure-Python implementation otherwise (correct but
slow: roughly 10 MB/s).
"""
from __future__ import annotations

__all__ = ["crc32c", "crc32c_pure", "ACCELERATED"]

_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _make_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()


def crc32c_pure(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of ``data`` continuing from ``crc`` (0 to start), pure Python."""
    table = _TABLE
    c = crc ^ 0xFFFFFFFF
    for b in memoryview(data).cast("B"):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


try:  # pragma: no cover - depends on the environment
    import crc32c as _accel

    def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
        """CRC32C of ``data`` continuing from ``crc`` (0 to start)."""
        return _accel.crc32c(data, crc)

    ACCELERATED = True
except ImportError:  # pragma: no cover
    crc32c = crc32c_pure
    ACCELERATED = False
