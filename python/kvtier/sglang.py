"""kvtier as an SGLang HiCache storage backend (``docs/sglang.md``).

Start SGLang with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierHiCache",
        "url": "127.0.0.1:50051"}'

SGLang keeps KV pages in a host memory pool (its L2) and asks a storage
backend (L3) for pages by key: a hash of the page's tokens chained over the
prefix, plus a rank suffix. How that maps onto kvtier:

* **One page is one kvtier block**, its payload the page's bytes as the host
  pool lays them out (``get_page_buffer_meta``: K and V, for every layer,
  page-first or layer-first). The namespace carries everything that changes
  those bytes: model, tensor/pipeline/context-parallel rank and size, MLA or
  not, the pool's layout, dtype, page size, layers, heads and head size, and
  this payload format's version. With MLA the TP rank is left out (every rank
  holds the same KV, and SGLang stores it from one rank only).
* ``batch_exists`` is kvtier's Lookup: the number of consecutive leading pages
  present, one round trip for the whole run.
* ``batch_get_v1`` / ``batch_set_v1`` move bytes straight between kvtier and
  the pool's pages (``Client.read_into``: scatter/gather over the page's
  segments, by the server itself on the same-host socket, no intermediate
  copy). A page of the wrong size is a miss, never reported loaded.
* Every failure is a miss (``False`` / ``0`` / ``None``), never an exception
  into SGLang's cache controller, and no call waits past ``timeout_ms``.

The v2 pool-transfer interface (``batch_*_v2``) is not implemented: SGLang
falls back to v1 for backends without it.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import re
import threading
import time
from typing import Any

import grpc

from .client import Client
from .errors import KvtierError
from .results import Block

try:  # SGLang's base class when SGLang is installed; a plain base otherwise (unit use)
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # pragma: no cover - depends on the environment
    _Base = object

__all__ = ["KvtierHiCache", "PAYLOAD_FORMAT"]

log = logging.getLogger("kvtier.sglang")

#: Version of the payload layout: a page's segments, in get_page_buffer_meta order.
PAYLOAD_FORMAT = "kvtier-sglang-payload-v1"
_OPTIONS = {"backend_name", "module_path", "class_name", "url", "timeout_ms", "namespace_prefix", "connections",
            "data_plane", "interface_v1"}


def _flag(extra: dict, key: str, default: bool) -> bool:
    """A boolean of the extra config: JSON true/false, or 1/0, or the strings
    true/false/1/0/yes/no (any case). Anything else is refused: ``bool("false")``
    would be true."""
    v = extra.get(key, default)
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    raise ValueError(f"kvtier HiCache backend: {key} must be true or false (or 1/0, yes/no), not {v!r}")


def _views(ptrs, sizes) -> list[memoryview]:
    """Writable byte views of raw host memory segments (the pool's pages)."""
    return [memoryview((ctypes.c_char * n).from_address(p)).cast("B") for p, n in zip(ptrs, sizes)]


class KvtierHiCache(_Base):
    """SGLang ``HiCacheStorage`` backed by a kvtier server."""

    def __init__(self, storage_config, kwargs: dict | None = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        unknown = sorted(set(extra) - _OPTIONS)
        if unknown:
            raise ValueError(f"kvtier HiCache backend: unknown extra config {unknown}; known: {sorted(_OPTIONS)}")
        url = str(extra.get("url", ""))
        if not url:
            raise ValueError('kvtier HiCache backend: extra config needs "url": "HOST:PORT" of a kvtier server')
        prefix = str(extra.get("namespace_prefix", ""))
        if not re.fullmatch(r"[A-Za-z0-9._:/-]{0,48}", prefix):
            raise ValueError(f"kvtier HiCache backend: bad namespace_prefix {prefix!r}")
        self.storage_config = storage_config
        self.url = url
        self.prefix = prefix
        self.timeout = int(extra.get("timeout_ms", 5000)) / 1000
        self.client = Client(url, connections=int(extra.get("connections", 4)), timeout=self.timeout, retries=1,
                             retry_shed=False, data_plane=_flag(extra, "data_plane", True))
        self.mem_pool_host: Any = None  # SGLang's host KV pool, once registered
        self.namespace = ""
        self.page_bytes = 0
        self.nbuf = 0
        self._last_warn: dict[str, float] = {}
        self._lock = threading.Lock()
        self.stats = {"exists": 0, "hit_pages": 0, "get_pages": 0, "loaded_pages": 0, "set_pages": 0,
                      "stored_pages": 0, "errors": 0, "bad_size": 0}

    # -- set-up -------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Learns the pool's page layout; the namespace follows from it."""
        self.mem_pool_host = mem_pool_host
        page = getattr(mem_pool_host, "page_size", 1)
        ptrs, sizes = mem_pool_host.get_page_buffer_meta(_page_indices(mem_pool_host, page))
        self.nbuf = len(ptrs)
        self.page_bytes = sum(sizes)
        sc = self.storage_config
        # MLA KV is the same on every TP rank: SGLang backs pages up from the
        # writer rank only (rank 0, or one per DCP shard: ``is_storage_writer``)
        # and takes the smallest hit count over the TP group, so every rank
        # must read the writer's namespace (the DCP shard still separates).
        mla = getattr(sc, "is_mla_model", False)
        facts = {
            "format": PAYLOAD_FORMAT,
            "model": getattr(sc, "model_name", None),
            "tp": [0 if mla else getattr(sc, "tp_rank", 0), getattr(sc, "tp_size", 1)],
            "pp": [getattr(sc, "pp_rank", 0), getattr(sc, "pp_size", 1)],
            "attn_cp": [getattr(sc, "attn_cp_rank", 0), getattr(sc, "attn_cp_size", 1)],
            "dcp": [getattr(sc, "dcp_rank", 0), getattr(sc, "dcp_size", 1)],
            "dp_rank": getattr(sc, "dp_rank", 0),
            "mla": mla,
            "split_heads": getattr(sc, "should_split_heads", False),
            "layout": getattr(mem_pool_host, "layout", None),
            "dtype": str(getattr(mem_pool_host, "dtype", None)),
            "page_size": page,
            "layers": getattr(mem_pool_host, "layer_num", None),
            "heads": getattr(mem_pool_host, "head_num", None),
            "head_dim": getattr(mem_pool_host, "head_dim", None),
            "segments": sizes,
        }
        digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:20]
        slug = re.sub(r"[^A-Za-z0-9._-]", "-", str(facts["model"] or "model").rstrip("/").split("/")[-1])[:40]
        self.namespace = f"{self.prefix}sglang/{slug}/{digest}"
        log.info("kvtier HiCache backend: %s, namespace %s, %d-byte pages in %d segments",
                 self.url, self.namespace, self.page_bytes, self.nbuf)

    # -- helpers -------------------------------------------------------------------

    def _warn(self, what: str, msg: str, *args) -> None:
        now = time.monotonic()
        with self._lock:
            quiet = now - self._last_warn.get(what, -1e9) < 30
            if not quiet:
                self._last_warn[what] = now
        (log.debug if quiet else log.warning)(msg, *args)

    def _failed(self, what: str, e: BaseException) -> None:
        self.stats["errors"] += 1
        self._warn(what, "kvtier %s failed (treated as a miss): %s", what, e)

    def _segments(self, host_indices) -> list[list[memoryview]]:
        """Per page, writable views of its segments in the host pool."""
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        n = self.nbuf
        views = _views(ptrs, sizes)
        return [views[i:i + n] for i in range(0, len(views), n)]

    @staticmethod
    def _key(k) -> bytes:
        return k.encode() if isinstance(k, str) else bytes(k)

    # -- v1 interface -------------------------------------------------------------------

    def batch_exists(self, keys: list[str], extra_info=None) -> int:
        try:
            self.stats["exists"] += 1
            found = self.client.lookup(self.namespace, keys=[self._key(k) for k in keys]).found
            self.stats["hit_pages"] += found
            return found
        except Exception as e:  # noqa: BLE001
            self._failed("exists", e)
            return 0

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_get_v1(self, keys: list[str], host_indices, extra_info=None) -> list[bool]:
        ok = [False] * len(keys)
        if not keys:
            return ok
        try:
            pages = self._segments(host_indices)
            self.stats["get_pages"] += len(keys)
            # Straight into the pool's pages (out of kvtier's shared memory on
            # the same-host socket): no bytes in between (notes/060).
            r = self.client.read_into(self.namespace, [self._key(k) for k in keys], pages)
            for b in r.blocks:
                n = sum(len(p) for p in b.payload) if isinstance(b.payload, list) else len(b.payload)
                if n == self.page_bytes:
                    ok[b.index] = True
                else:  # a page of the wrong size for this layout: not loaded
                    self.stats["bad_size"] += 1
                    self._warn("size", "kvtier page %s has %d bytes, expected %d: not loaded",
                               keys[b.index], n, self.page_bytes)
                    break
            # Only a leading run counts: SGLang loads prefixes.
            first_miss = ok.index(False) if False in ok else len(ok)
            ok = [i < first_miss for i in range(len(ok))]
            self.stats["loaded_pages"] += first_miss
        except Exception as e:  # noqa: BLE001
            self._failed("get", e)
            ok = [False] * len(keys)
        return ok

    def batch_set_v1(self, keys: list[str], host_indices, extra_info=None) -> list[bool]:
        if not keys:
            return []
        try:
            pages = self._segments(host_indices)
            prefix = list(getattr(extra_info, "prefix_keys", None) or [])
            parent = self._key(prefix[-1]) if prefix else None
            blocks = []
            for k, segs in zip(keys, pages):
                key = self._key(k)
                blocks.append(Block(key=key, payload=segs, parent=parent))
                parent = key
            self.stats["set_pages"] += len(blocks)
            return self._store(blocks)
        except Exception as e:  # noqa: BLE001
            self._failed("set", e)
            return [False] * len(keys)

    def _store(self, blocks: list) -> list[bool]:
        try:
            r = self.client.write(self.namespace, blocks)
            self.stats["stored_pages"] += r.stored
            return [True] * len(blocks)
        except KvtierError as e:
            if e.code != grpc.StatusCode.FAILED_PRECONDITION or len(blocks) == 1:
                raise
        # A page already stored with other bytes (another writer): the first
        # writer wins; store the rest one by one.
        out = []
        for b in blocks:
            try:
                self.stats["stored_pages"] += self.client.write(self.namespace, [b]).stored
                out.append(True)
            except KvtierError as e:
                out.append(e.code == grpc.StatusCode.FAILED_PRECONDITION)
        return out

    # -- the older interface ----------------------------------------------------------------

    def get(self, key: str, target_location: Any | None = None, target_sizes: Any | None = None):
        """The page's bytes into ``target_location`` (a tensor) when given; returns it, or ``None``."""
        try:
            if target_location is not None:
                view = memoryview(target_location.view(-1).numpy()).cast("B")
                r = self.client.read_into(self.namespace, [self._key(key)], [view])
                if not r.blocks or len(r.blocks[0].payload) != view.nbytes:
                    return None
                return target_location
            r = self.client.read(self.namespace, [self._key(key)])
            if not r.blocks:
                return None
            import torch

            payload = r.blocks[0].payload
            assert not isinstance(payload, list)  # read without `into`: one buffer
            return torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        except Exception as e:  # noqa: BLE001
            self._failed("get", e)
            return None

    def batch_get(self, keys: list[str], target_locations: Any | None = None,
                  target_sizes: Any | None = None):
        locs = target_locations or [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, locs)]

    def set(self, key: str, value: Any | None = None, target_location: Any | None = None,
            target_sizes: Any | None = None) -> bool:
        try:
            src: Any = value if value is not None else target_location
            data = memoryview(src.contiguous().view(-1).view(__import__("torch").uint8).numpy()).cast("B")
            return self._store([Block(key=self._key(key), payload=data)])[0]
        except Exception as e:  # noqa: BLE001
            self._failed("set", e)
            return False

    def batch_set(self, keys: list[str], values: Any | None = None, target_locations: Any | None = None,
                  target_sizes: Any | None = None) -> bool:
        vals: Any = values if values is not None else target_locations
        return all(self.set(k, v) for k, v in zip(keys, vals))

    def clear(self) -> None:
        log.info("kvtier HiCache backend: clear() leaves kvtier as it is (blocks are shared and evicted by kvtier)")

    def get_stats(self):
        return dict(self.stats)

    def close(self) -> None:
        self.client.close()


def _page_indices(pool, page: int):
    """Token indices of the pool's first page (to learn its segment layout)."""
    import torch

    return torch.arange(page, dtype=torch.int64)
