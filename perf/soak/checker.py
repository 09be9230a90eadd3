"""The soak's ledger: what was written, what was acknowledged, what was
served, and the verdict (``lost``, ``corrupt``).

Pure logic, no I/O, so ``python/tests/test_soak.py`` can show that it counts
a loss and a corruption (docs/durability.md, "A soak with faults").

Blocks are immutable and every key is written with one payload only, so a
key names exactly one byte string: a read that returns anything else for it
is *corrupt*, whether or not its write was acknowledged (a write that timed
out may still have been stored, and then it must be served intact). A key
whose write was acknowledged and that the final read (after every fault was
healed and the server restarted) does not return is *lost*.
"""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Ledger", "Verdict", "digest"]


def digest(payload: bytes | bytearray | memoryview) -> bytes:
    """The 16-byte BLAKE2b of a payload: what the ledger keeps per key."""
    return hashlib.blake2b(payload, digest_size=16).digest()


@dataclass
class Verdict:
    """The final check's counts."""

    acknowledged: int = 0
    #: Acknowledged and not returned by the final read.
    lost: int = 0
    #: Reads (during the run or at the end) that returned bytes other than
    #: those written for the key, or a key never written.
    corrupt: int = 0
    #: Attempted, not acknowledged, and found at the end anyway (a write whose
    #: answer was lost in a fault): allowed, counted for the record.
    unacknowledged_found: int = 0
    #: A few examples of each failure, hex keys, for the report.
    lost_keys: list[str] = field(default_factory=list)
    corrupt_keys: list[str] = field(default_factory=list)


class Ledger:
    """Thread-safe record of attempted and acknowledged writes.

    ``attempt`` before sending a write, ``acknowledge`` once the server said
    stored (or existing), ``served`` for every block a read returned,
    ``final`` for every key the last read returned (or ``None`` for a key it
    did not return).
    """

    EXAMPLES = 20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: dict[bytes, bytes] = {}
        self._acked: set[bytes] = set()
        self._corrupt = 0
        self._corrupt_keys: list[str] = []

    def attempt(self, key: bytes, payload_digest: bytes) -> None:
        with self._lock:
            old = self._written.setdefault(key, payload_digest)
        if old != payload_digest:
            raise ValueError(f"key {key.hex()} written twice with different bytes: the soak never does that")

    def acknowledge(self, key: bytes) -> None:
        with self._lock:
            if key not in self._written:
                raise KeyError(f"acknowledged key {key.hex()} was never attempted")
            self._acked.add(key)

    def acknowledged_keys(self) -> list[bytes]:
        with self._lock:
            return list(self._acked)

    def attempted_keys(self) -> list[bytes]:
        with self._lock:
            return list(self._written)

    @property
    def acknowledged(self) -> int:
        with self._lock:
            return len(self._acked)

    @property
    def corrupt(self) -> int:
        with self._lock:
            return self._corrupt

    def served(self, key: bytes, payload_digest: bytes) -> bool:
        """A read returned these bytes for ``key``; False (and counted) when
        they are not what was written for it."""
        with self._lock:
            ok = self._written.get(key) == payload_digest
            if not ok:
                self._corrupt += 1
                if len(self._corrupt_keys) < self.EXAMPLES:
                    self._corrupt_keys.append(key.hex())
            return ok

    def final(self, results: Iterable[tuple[bytes, bytes | None]]) -> Verdict:
        """The verdict from the last read of each key: ``(key, digest)`` of
        what it returned, ``(key, None)`` when it returned nothing. Keys the
        iterable leaves out count as not returned."""
        seen: dict[bytes, bytes | None] = dict(results)
        for key, d in seen.items():
            if d is not None:
                self.served(key, d)
        v = Verdict()
        with self._lock:
            v.acknowledged = len(self._acked)
            for key in self._acked:
                if seen.get(key) is None:
                    v.lost += 1
                    if len(v.lost_keys) < self.EXAMPLES:
                        v.lost_keys.append(key.hex())
            v.unacknowledged_found = sum(1 for k, d in seen.items() if d is not None and k not in self._acked)
            v.corrupt = self._corrupt
            v.corrupt_keys = list(self._corrupt_keys)
        return v
