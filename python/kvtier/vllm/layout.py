"""kvtier's payload for one vLLM block, and the copies to and from vLLM's cache.

vLLM (0.32+) hands every connector its KV cache as one ``[B, H, N, C]`` view
per attention layer, whatever the backend's memory layout: blocks, KV-head
slots, tokens in the block, content (K and V of one head). kvtier's payload is
defined on that logical view, not on a backend's memory order::

    payload(block) = for each layer in the model's order:
                         the layer's [H, block_size, C] tile of that block,
                         C-contiguous, in the cache dtype's bytes

so it is ``layers * H * block_size * C * itemsize`` bytes (docs/vllm.md). When
the attention kernel splits a scheduler block into ``k`` smaller kernel
blocks (``N = block_size / k``), the ``k`` tiles are interleaved back into
token order, so the payload is the same whatever the kernel block size.
"""
from __future__ import annotations

import threading
import warnings

import torch

__all__ = ["PayloadLayout", "LayoutError"]


class LayoutError(ValueError):
    """The KV cache does not have a shape this layout can describe."""


class PayloadLayout:
    """Copies blocks between vLLM's per-layer caches and kvtier payloads."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], layer_names: list[str], block_size: int,
                 batched: bool | None = None):
        missing = [n for n in layer_names if n not in kv_caches]
        if missing:
            raise LayoutError(f"KV caches registered without layers {missing[:3]}")
        self.layers = [kv_caches[n] for n in layer_names]
        first = self.layers[0]
        if first.dim() != 4:
            raise LayoutError(f"expected [B, H, N, C] per-layer KV caches, got shape {tuple(first.shape)}")
        for name, t in zip(layer_names, self.layers):
            if t.shape[1:] != first.shape[1:] or t.dtype != first.dtype or t.device != first.device:
                raise LayoutError(f"layer {name} has {tuple(t.shape)} {t.dtype}, unlike the first layer")
        _, self.heads, n, self.content = first.shape
        if n == 0 or block_size % n:
            raise LayoutError(f"kernel block of {n} tokens does not divide the block size {block_size}")
        self.split = block_size // n  # kernel blocks per scheduler block
        self.kernel_tokens = n
        self.block_size = block_size
        self.dtype = first.dtype
        self.device = first.device
        self.itemsize = first.element_size()
        self.layer_elems = self.heads * block_size * self.content
        #: Bytes of one block's payload.
        self.nbytes = len(self.layers) * self.layer_elems * self.itemsize
        #: Copy whole layers with one indexed kernel (default on accelerators)
        #: rather than tile by tile (default on the CPU, where it saves a copy).
        self.batched = self.device.type != "cpu" if batched is None else batched
        # The batched path moves bits, not numbers: an integer view of the
        # same width (index kernels do not exist for every float8 type).
        self._bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[self.itemsize]
        # One staging buffer kept for the next load: a fresh 512 MiB buffer
        # costs its page faults on every load (355 ms against 38 ms for the
        # copy itself, notes/049-vllm-ttft-paths.md).
        self._staging_lock = threading.Lock()
        self._staging_free: torch.Tensor | None = None
        # Where each layer's tile of a block is one range of memory in
        # payload order (a contiguous [B, H, N, C] cache on the CPU, kernel
        # blocks the scheduler's), a load lands straight in vLLM's cache: one
        # region per layer per block, no staging copy (notes/050). One uint8
        # [B, bytes] view per layer, made once: a view per block and layer
        # would cost microseconds each, thousands per load.
        self._layer_rows = None
        if self.device.type == "cpu" and self.split == 1 and all(t.is_contiguous() for t in self.layers):
            self._layer_rows = [t.view(torch.uint8).view(t.shape[0], -1).numpy() for t in self.layers]

    def describe(self) -> dict:
        return {
            "layers": len(self.layers),
            "heads": self.heads,
            "block_size": self.block_size,
            "content": self.content,
            "kernel_block_tokens": self.kernel_tokens,
            "dtype": str(self.dtype),
            "device": str(self.device),
            "payload_bytes": self.nbytes,
        }

    def _tile(self, kv: torch.Tensor, block_id: int) -> torch.Tensor:
        """Layer ``kv``'s tile of scheduler block ``block_id`` as [H, k, n, C] (a view)."""
        k = self.split
        return kv[block_id * k:(block_id + 1) * k].permute(1, 0, 2, 3)

    def _kernel_index(self, block_ids) -> torch.Tensor:
        """The kernel blocks of ``block_ids``, in order, as an index on the cache's device."""
        ids = torch.as_tensor(list(block_ids), dtype=torch.long)
        if self.split > 1:
            ids = (ids[:, None] * self.split + torch.arange(self.split)).reshape(-1)
        return ids.to(self.device)

    def _payload_shape(self, n: int) -> tuple:
        return (n, len(self.layers), self.heads, self.split, self.kernel_tokens, self.content)

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """A host ``uint8`` tensor ``[len(block_ids), nbytes]``: each row one block's payload.

        On the CPU each tile is copied straight into its place. On an
        accelerator a per-tile loop is launch-bound (notes/018), so each layer
        is gathered with one ``index_select`` over all the blocks, on the
        device, and the payloads then go to pinned host memory in one transfer.
        """
        n = len(block_ids)
        if not self.batched:
            out = torch.empty(self._payload_shape(n), dtype=self.dtype, device=self.device)
            for i, b in enumerate(block_ids):
                for layer, kv in enumerate(self.layers):
                    out[i, layer].copy_(self._tile(kv, b))
        else:
            out = torch.empty(self._payload_shape(n), dtype=self._bits, device=self.device)
            idx = self._kernel_index(block_ids)
            for layer, kv in enumerate(self.layers):
                # [n*k, H, N, C] -> [n, k, H, N, C] -> [n, H, k, N, C]
                sel = kv.view(self._bits).index_select(0, idx)
                sel = sel.view(n, self.split, self.heads, self.kernel_tokens, self.content)
                out[:, layer].copy_(sel.permute(0, 2, 1, 3, 4))
        if self.device.type != "cpu":
            host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            host.copy_(out)  # synchronous: the blocks may be reused after this step
            out = host
        return out.view(torch.uint8).view(n, self.nbytes)

    def _check(self, payload) -> None:
        if len(payload) != self.nbytes:
            raise LayoutError(f"payload of {len(payload)} bytes, expected {self.nbytes}")

    @staticmethod
    def _bytes(payload, **kw) -> torch.Tensor:
        with warnings.catch_warnings():
            # The payload is read-only bytes; it is only read from.
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(payload, dtype=torch.uint8, **kw)

    def scatter(self, block_id: int, payload) -> None:
        """Copies one payload (bytes-like of exactly ``nbytes``) into vLLM block ``block_id``."""
        self.scatter_many([block_id], [payload])

    @property
    def loads_in_place(self) -> bool:
        """Whether :meth:`block_regions` can give a read its destinations."""
        return self._layer_rows is not None

    def block_regions(self, block_ids: list[int]) -> list[list]:
        """Each block's destination in vLLM's own cache, for a read that lands
        there with no staging copy: one writable region per layer, in payload
        order (``Client.read_into`` fills them in turn). Only where
        :attr:`loads_in_place`."""
        if self._layer_rows is None:
            raise LayoutError("this cache cannot take payloads in place")
        return [[rows[b] for rows in self._layer_rows] for b in block_ids]

    def staging_rows(self, n: int) -> torch.Tensor:
        """A ``uint8`` buffer ``[n, nbytes]`` a read lands in before
        :meth:`scatter_many` (given as ``host``): pinned on an accelerator
        (the transfer to the device reads it by DMA), plain memory on the CPU.
        The buffer last given back with :meth:`release_rows` is reused when
        it is large enough (its pages are already mapped); concurrent loads
        get fresh ones."""
        with self._staging_lock:
            free = self._staging_free
            if free is not None and free.shape[0] >= n:
                self._staging_free = None
                return free[:n]
        return self._rows(n)

    def release_rows(self, rows: torch.Tensor) -> None:
        """Gives back a :meth:`staging_rows` buffer once nothing reads it any
        more (its payloads are copied into vLLM's cache); the largest one is
        kept for the next load."""
        base = rows._base if rows._base is not None else rows
        with self._staging_lock:
            if self._staging_free is None or base.shape[0] > self._staging_free.shape[0]:
                self._staging_free = base

    def host_rows(self, n: int) -> torch.Tensor | None:
        """A pinned ``uint8`` buffer ``[n, nbytes]`` that payloads can be
        received straight into (``Client.read(into=...)``) and then given to
        :meth:`scatter_many` as ``host``; ``None`` where it saves nothing (the
        CPU, or the per-tile path)."""
        if self.device.type == "cpu" or not self.batched:
            return None
        return self._rows(n)

    def _rows(self, n: int) -> torch.Tensor:
        """``[n, nbytes]`` bytes on the host, pinned where a device will read them."""
        return torch.empty((n, self.nbytes), dtype=torch.uint8, pin_memory=self.device.type != "cpu")

    def scatter_many(self, block_ids: list[int], payloads: list, host: torch.Tensor | None = None) -> None:
        """Copies ``payloads[i]`` into vLLM block ``block_ids[i]``, for all ``i``.

        On the CPU each tile is copied straight from the payload. On an
        accelerator the payloads are packed into one pinned host buffer, sent
        in one transfer and written with one ``index_copy_`` per layer; the
        call returns once the copies are done, as the per-tile copies did.
        ``host``: the :meth:`host_rows` buffer whose row ``i`` already holds
        ``payloads[i]``, for every ``i``; the packing copy is then skipped.
        """
        if len(block_ids) != len(payloads):
            raise LayoutError(f"{len(block_ids)} block ids for {len(payloads)} payloads")
        for p in payloads:
            self._check(p)
        n = len(payloads)
        if n == 0:
            return
        if not self.batched:
            for b, p in zip(block_ids, payloads):
                src = self._bytes(p).view(self.dtype).view(self._payload_shape(1)[1:])
                for layer, kv in enumerate(self.layers):
                    self._tile(kv, b).copy_(src[layer])
            return
        on_device = self.device.type != "cpu"
        if host is None or host.shape[0] < n:
            host = self._rows(n)
            for i, p in enumerate(payloads):
                host[i].copy_(self._bytes(p))
        host = host[:n]
        # Asynchronous only where the stream is synchronized below (CUDA): on
        # other accelerators the copy blocks, so `host` may be freed after it.
        src = host.to(self.device, non_blocking=self.device.type == "cuda") if on_device else host
        self._scatter_rows(block_ids, src)

    def _scatter_rows(self, block_ids: list[int], rows: torch.Tensor) -> None:
        """Writes ``rows`` (``[n, nbytes]`` on the device, or on the host for
        a CPU cache) into vLLM's blocks ``block_ids``; returns once done."""
        n = len(block_ids)
        src = rows.view(self._bits).view(self._payload_shape(n))
        idx = self._kernel_index(block_ids)
        for layer, kv in enumerate(self.layers):
            # [n, H, k, N, C] -> [n, k, H, N, C] -> [n*k, H, N, C]
            tiles = src[:, layer].permute(0, 2, 1, 3, 4).reshape(n * self.split, self.heads, self.kernel_tokens,
                                                               self.content)
            kv.view(self._bits).index_copy_(0, idx, tiles)
        if self.device.type == "cuda":
            # Loads may run on a loader thread and are reported done to the
            # scheduler afterwards: the blocks must be in place by then.
            torch.cuda.current_stream(self.device).synchronize()

    def scatter_pinned(self, block_ids: list[int], payloads: list) -> None:
        """:meth:`scatter_many` for payloads already in pinned host memory
        (kvtier's shared memory, registered with the driver): on a CUDA
        device each is DMA'd into one device buffer, with no packing copy on
        the CPU, then written with one ``index_copy_`` per layer."""
        if self.device.type != "cuda" or not self.batched or not payloads:
            return self.scatter_many(block_ids, payloads)
        if len(block_ids) != len(payloads):
            raise LayoutError(f"{len(block_ids)} block ids for {len(payloads)} payloads")
        for p in payloads:
            self._check(p)
        rows = torch.empty((len(payloads), self.nbytes), dtype=torch.uint8, device=self.device)
        for i, p in enumerate(payloads):
            rows[i].copy_(self._bytes(p), non_blocking=True)
        self._scatter_rows(block_ids, rows)

    def scatter_layer(self, layer: int, block_id: int, payload) -> None:
        """Copies one layer of one payload into vLLM block ``block_id`` (layer-wise loading)."""
        size = self.layer_elems * self.itemsize
        src = self._bytes(payload, count=size, offset=layer * size)
        src = src.view(self.dtype).view(self.heads, self.split, self.kernel_tokens, self.content)
        self._tile(self.layers[layer], block_id).copy_(src.to(self.device) if self.device.type != "cpu" else src)
