"""Pinning kvtier's shared memory for a GPU (docs/local.md, "Loads a GPU
reads in place"): each segment a :meth:`kvtier.Client.map_read` result names
is registered once with CUDA, read-only (``cudaHostRegister`` with
``cudaHostRegisterReadOnly``), so the GPU's copy engine DMAs blocks straight
out of it. A registration is kept per segment id; when a new segment is
mapped where an old one was (its connection closed, the address reused), the
old registration is dropped first, since CUDA still holds the old pages.
Needs torch with CUDA; on other devices :meth:`HostPins.pin` does nothing."""
from __future__ import annotations

import threading

#: cudaHostRegisterReadOnly (CUDA 11.1+): the device only reads these pages,
#: which a read-only mapping requires.
READ_ONLY = 8


class PinError(RuntimeError):
    """CUDA refused to pin a segment: the load falls back to a staged copy."""


class HostPins:
    """The segments this process has pinned, by address."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._lock = threading.Lock()
        self._by_addr: dict[int, tuple[int, int]] = {}  # address -> (segment id, length)
        self.pinned_bytes = 0

    def pin(self, segments: list[tuple[int, int, int]]) -> None:
        """Registers every ``(id, address, length)`` not registered yet."""
        if not self.cuda:
            return
        import torch

        rt = torch.cuda.cudart()
        with self._lock:
            for seg, addr, n in segments:
                if self._by_addr.get(addr) == (seg, n):
                    continue
                # Registrations this mapping overlaps belong to mappings gone.
                for a, (_, m) in list(self._by_addr.items()):
                    if a < addr + n and addr < a + m:
                        rt.cudaHostUnregister(a)
                        del self._by_addr[a]
                        self.pinned_bytes -= m
                rc = rt.cudaHostRegister(addr, n, READ_ONLY)
                if int(rc) != 0:
                    raise PinError(f"cudaHostRegister of a {n}-byte kvtier segment failed ({rc}); "
                                   "docs/local.md, 'Requirements'")
                self._by_addr[addr] = (seg, n)
                self.pinned_bytes += n
