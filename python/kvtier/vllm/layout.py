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

import warnings

import torch

__all__ = ["PayloadLayout", "LayoutError"]


class LayoutError(ValueError):
    """The KV cache does not have a shape this layout can describe."""


class PayloadLayout:
    """Copies blocks between vLLM's per-layer caches and kvtier payloads."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], layer_names: list[str], block_size: int):
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

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """A host ``uint8`` tensor ``[len(block_ids), nbytes]``: each row one block's payload."""
        n = len(block_ids)
        shape = (n, len(self.layers), self.heads, self.split, self.kernel_tokens, self.content)
        if self.device.type == "cpu":
            out = torch.empty(shape, dtype=self.dtype)
            for i, b in enumerate(block_ids):
                for l, kv in enumerate(self.layers):
                    out[i, l].copy_(self._tile(kv, b))
            return out.view(torch.uint8).view(n, self.nbytes)
        # Accelerator: gather on the device, then one copy into pinned host memory.
        staging = torch.empty(shape, dtype=self.dtype, device=self.device)
        for i, b in enumerate(block_ids):
            for l, kv in enumerate(self.layers):
                staging[i, l].copy_(self._tile(kv, b))
        host = torch.empty(shape, dtype=self.dtype, pin_memory=True)
        host.copy_(staging)  # synchronous: the blocks may be reused after this step
        return host.view(torch.uint8).view(n, self.nbytes)

    def scatter(self, block_id: int, payload) -> None:
        """Copies one payload (bytes-like of exactly ``nbytes``) into vLLM block ``block_id``."""
        if len(payload) != self.nbytes:
            raise LayoutError(f"payload of {len(payload)} bytes, expected {self.nbytes}")
        with warnings.catch_warnings():
            # The payload is read-only bytes; it is only read from.
            warnings.simplefilter("ignore", UserWarning)
            src = torch.frombuffer(payload, dtype=torch.uint8)
        src = src.view(self.dtype).view(len(self.layers), self.heads, self.split, self.kernel_tokens, self.content)
        if self.device.type != "cpu":
            src = src.to(self.device)
        for l, kv in enumerate(self.layers):
            self._tile(kv, block_id).copy_(src[l])

    def scatter_layer(self, layer: int, block_id: int, payload) -> None:
        """Copies one layer of one payload into vLLM block ``block_id`` (layer-wise loading)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            src = torch.frombuffer(payload, dtype=torch.uint8, count=self.layer_elems * self.itemsize,
                                   offset=layer * self.layer_elems * self.itemsize)
        src = src.view(self.dtype).view(self.heads, self.split, self.kernel_tokens, self.content)
        self._tile(self.layers[layer], block_id).copy_(src.to(self.device) if self.device.type != "cpu" else src)
