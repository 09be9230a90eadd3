"""Loads a GPU DMAs straight from kvtier's shared memory (docs/local.md,
"Loads a GPU reads in place"), for the measurement scripts
(scripts/gpu-ttft.py): each segment a read names is pinned once, read-only
(``cudaHostRegister`` with ``cudaHostRegisterReadOnly``), and each block is
copied by the GPU's copy engine from the mapping into its destination on a
side stream, with no copy on the CPU. The reads stay leased until the copies
are done (:meth:`MappedLoads.finish`). On a CPU device (a dry run) the same
steps run with the copies done by the CPU and nothing pinned."""
from __future__ import annotations

import ctypes
from typing import Any

import torch

from kvtier.pins import HostPins


class MappedLoads:
    """Blocks copied from ``Client.map_read`` results into rows of ``dst``."""

    def __init__(self, dev: torch.device, stream: Any) -> None:
        self.dev, self.stream = dev, stream
        self.pins = HostPins(dev.type == "cuda")
        self.held: list[Any] = []

    def start(self, mapped: Any, dst: torch.Tensor, first: int) -> int:
        """Starts copying ``mapped``'s blocks into ``dst[first:]``; keeps the
        read leased until :meth:`finish`. Returns the blocks started."""
        self.pins.pin(mapped.segments)
        self.held.append(mapped)
        srcs = [torch.frombuffer((ctypes.c_ubyte * n).from_address(addr), dtype=torch.uint8)
                for addr, n in mapped.regions]
        if self.stream is None:
            for i, s in enumerate(srcs):
                dst[first + i][: s.numel()].copy_(s)
            return len(srcs)
        with torch.cuda.stream(self.stream):
            for i, s in enumerate(srcs):
                dst[first + i][: s.numel()].copy_(s, non_blocking=True)
        return len(srcs)

    def finish(self) -> None:
        """Waits for the copies, then releases every read."""
        if self.stream is not None:
            self.stream.synchronize()
            torch.cuda.current_stream(self.dev).wait_stream(self.stream)
        for m in self.held:
            m.release()
        self.held.clear()
