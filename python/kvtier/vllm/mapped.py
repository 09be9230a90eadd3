"""Loads a GPU reads in place: on kvtier's same-host socket, a CUDA worker
reads with ``Client.map_read``; each kvtier segment is pinned once,
read-only (:class:`kvtier.pins.HostPins`), and every block is DMA'd from
kvtier's shared memory into vLLM's cache with no copy on the CPU
(``PayloadLayout.scatter_pinned``; docs/vllm.md, ``load_mapped``)."""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..pins import HostPins


class MappedLoad:
    """The blocks of one ``map_read``, as arrays over kvtier's shared memory
    (valid until :meth:`release`)."""

    def __init__(self, mapped: Any, pins: HostPins) -> None:
        self.mapped = mapped
        try:
            pins.pin(mapped.segments)
        except Exception:
            mapped.release()
            raise
        self.keys = [b[1] for b in mapped.blocks]
        self.reason = mapped.reason
        self.payloads = [np.frombuffer((ctypes.c_ubyte * n).from_address(addr), dtype=np.uint8)
                         for addr, n in mapped.regions]

    def release(self) -> None:
        """Gives the blocks back to kvtier once nothing reads them any more."""
        self.payloads = []
        self.mapped.release()
