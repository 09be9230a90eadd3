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

Hybrid models (sliding-window, Mamba, DeepSeek's extra pools) go through
SGLang's v2 pool-transfer interface (``register_mem_host_pool_v2``,
``batch_exists_v2``, ``batch_get_v2``, ``batch_set_v2``; ``sglang_pools``):

* every extra pool keeps its pages in a namespace of its own (the facts above
  with the pool's name and its own layout and page bytes); the KV pool keeps
  v1's namespace, so v1 and v2 move the same KV pages;
* ``batch_exists_v2`` folds each pool's hit policy into the hit: ALL_PAGES
  pools one Lookup of the KV hit's pages; TRAILING_PAGES pools (SWA windows,
  Mamba states) Lookups of the window before a candidate length, read
  backwards, moving the hit back past a missing page, as SGLang's own
  backends do; it returns the lengths proven restorable
  (``restorable_prefix_pages``). BLOCK_GROUPS pools never gate the hit and
  get no verdict (SGLang 0.5.23 declares the policy but nothing uses it);
* ``batch_get_v2`` / ``batch_set_v2`` move each pool's pages as v1 moves KV
  pages (segments from ``get_page_buffer_meta``; whole flat pages for pools
  without segments, e.g. a Mamba pool with side states), with the same rules:
  a wrong-size page is a miss, every failure a miss, one deadline per call.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from typing import Any

import grpc

from . import sglang_pools as _pools
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
        # A logical KV anchor (DeepSeek V4) holds no bytes: its pages are in other pools.
        self.kv_logical = False
        self.pools: dict[str, _pools.Pool] = {}  # by pool name, the KV pool included
        self.registered_pools: dict[Any, Any] = {}  # SGLang's base class keeps this too
        self._last_warn: dict[str, float] = {}
        self._lock = threading.Lock()
        self.stats = {"exists": 0, "hit_pages": 0, "get_pages": 0, "loaded_pages": 0, "set_pages": 0,
                      "stored_pages": 0, "errors": 0, "bad_size": 0, "pool_get_pages": 0,
                      "pool_loaded_pages": 0, "pool_set_pages": 0, "pool_lookups": 0}

    # -- set-up -------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Learns the pool's page layout; the namespace follows from it."""
        self.mem_pool_host = mem_pool_host
        page = getattr(mem_pool_host, "page_size", 1)
        meta = mem_pool_host.get_page_buffer_meta(_page_indices(mem_pool_host, page))
        self.kv_logical = meta is None
        ptrs, sizes = meta if meta is not None else ([], [])
        self.nbuf = len(ptrs)
        self.page_bytes = sum(sizes)
        facts = {
            **self._rank_facts(sharded=False),
            "layout": getattr(mem_pool_host, "layout", None),
            "dtype": str(getattr(mem_pool_host, "dtype", None)),
            "page_size": page,
            "layers": getattr(mem_pool_host, "layer_num", None),
            "heads": getattr(mem_pool_host, "head_num", None),
            "head_dim": getattr(mem_pool_host, "head_dim", None),
            "segments": sizes,
        }
        digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:20]
        self.namespace = f"{self.prefix}sglang/{self._slug()}/{digest}"
        self.pools[_pools.KV] = _pools.Pool(_pools.KV, mem_pool_host, self.namespace,
                                            _pools.NONE if self.kv_logical else _pools.SEGMENTS,
                                            page, self.nbuf, self.page_bytes)
        log.info("kvtier HiCache backend: %s, namespace %s, %d-byte pages in %d segments",
                 self.url, self.namespace, self.page_bytes, self.nbuf)

    def _rank_facts(self, sharded: bool) -> dict:
        """The model's and this rank's facts, which every pool's namespace carries."""
        sc = self.storage_config
        # MLA KV is the same on every TP rank: SGLang backs pages up from the
        # writer rank only (rank 0, or one per DCP shard: ``is_storage_writer``)
        # and takes the smallest hit count over the TP group, so every rank
        # must read the writer's namespace (the DCP shard still separates).
        # A pool sharded over the ranks anyway (Mamba state) keeps its rank.
        mla = getattr(sc, "is_mla_model", False)
        return {
            "format": PAYLOAD_FORMAT,
            "model": getattr(sc, "model_name", None),
            "tp": [0 if mla and not sharded else getattr(sc, "tp_rank", 0), getattr(sc, "tp_size", 1)],
            "pp": [getattr(sc, "pp_rank", 0), getattr(sc, "pp_size", 1)],
            "attn_cp": [getattr(sc, "attn_cp_rank", 0), getattr(sc, "attn_cp_size", 1)],
            "dcp": [getattr(sc, "dcp_rank", 0), getattr(sc, "dcp_size", 1)],
            "dp_rank": getattr(sc, "dp_rank", 0),
            "mla": mla,
            "split_heads": getattr(sc, "should_split_heads", False),
        }

    def _slug(self) -> str:
        model = getattr(self.storage_config, "model_name", None)
        return re.sub(r"[^A-Za-z0-9._-]", "-", str(model or "model").rstrip("/").split("/")[-1])[:40]

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
        views = _pools.views(ptrs, sizes)
        return [views[i:i + n] for i in range(0, len(views), n)]

    @staticmethod
    def _key(k) -> bytes:
        return k.encode() if isinstance(k, str) else bytes(k)

    @staticmethod
    def _left(deadline: float | None) -> float | None:
        """Seconds left before ``deadline`` (``None``: the client's own timeout)."""
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left < 0.001:
            raise KvtierError(grpc.StatusCode.DEADLINE_EXCEEDED, "kvtier HiCache backend: out of time")
        return left

    def _loaded(self, r, keys, page_bytes: int) -> int:
        """How many leading pages a read filled whole. A page of the wrong size
        for the layout is not loaded, nor any after it: SGLang loads prefixes."""
        n = 0
        for b in r.blocks:
            size = sum(len(p) for p in b.payload) if isinstance(b.payload, list) else len(b.payload)
            if b.index != n:
                break
            if size != page_bytes:
                self.stats["bad_size"] += 1
                self._warn("size", "kvtier page %s has %d bytes, expected %d: not loaded", keys[b.index], size,
                           page_bytes)
                break
            n += 1
        return n

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
        if self.kv_logical:  # nothing to load: the pages are in the v2 pools
            return [True] * len(keys)
        ok = [False] * len(keys)
        if not keys:
            return ok
        try:
            pages = self._segments(host_indices)
            self.stats["get_pages"] += len(keys)
            # Straight into the pool's pages (out of kvtier's shared memory on
            # the same-host socket): no bytes in between (notes/060).
            r = self.client.read_into(self.namespace, [self._key(k) for k in keys], pages)
            first_miss = self._loaded(r, keys, self.page_bytes)
            ok = [i < first_miss for i in range(len(ok))]
            self.stats["loaded_pages"] += first_miss
        except Exception as e:  # noqa: BLE001
            self._failed("get", e)
            ok = [False] * len(keys)
        return ok

    def batch_set_v1(self, keys: list[str], host_indices, extra_info=None) -> list[bool]:
        if not keys or self.kv_logical:
            return [True] * len(keys)
        try:
            pages = self._segments(host_indices)
            self.stats["set_pages"] += len(keys)
            return self._store(self._chain(keys, pages, extra_info, linked=True))
        except Exception as e:  # noqa: BLE001
            self._failed("set", e)
            return [False] * len(keys)

    def _chain(self, keys, payloads, extra_info, linked: bool) -> list:
        """Blocks of pages; ``linked``: each page's parent is the page before it
        (``prefix_keys`` + ``keys`` is one chain, SGLang's contract)."""
        prefix = list(getattr(extra_info, "prefix_keys", None) or [])
        parent = self._key(prefix[-1]) if prefix and linked else None
        blocks = []
        for k, payload in zip(keys, payloads):
            key = self._key(k)
            blocks.append(Block(key=key, payload=payload, parent=parent))
            parent = key if linked else None
        return blocks

    def _store(self, blocks: list, namespace: str | None = None, deadline: float | None = None) -> list[bool]:
        ns = namespace or self.namespace
        try:
            r = self.client.write(ns, blocks, timeout=self._left(deadline))
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
                self.stats["stored_pages"] += self.client.write(ns, [b], timeout=self._left(deadline)).stored
                out.append(True)
            except KvtierError as e:
                out.append(e.code == grpc.StatusCode.FAILED_PRECONDITION)
        return out

    # -- v2 interface: the pools of hybrid models (sglang_pools) ---------------------------

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        """Learns one pool's layout; its namespace follows from it. Never raises:
        a pool whose pages cannot be moved is a miss on every call."""
        self.registered_pools[host_pool_name] = host_pool
        name = _pools.name_of(host_pool_name)
        if name == _pools.KV:  # the anchor, registered through v1: v1's namespace
            if self.mem_pool_host is None:
                self.register_mem_pool_host(host_pool)
            return
        try:
            mode, page, sizes = _pools.probe(host_pool)
        except Exception as e:  # noqa: BLE001
            self._warn("pool", "kvtier HiCache backend: pool %s: pages cannot be moved (%s); its pages miss",
                       name, e)
            mode, page, sizes = _pools.BROKEN, int(getattr(host_pool, "page_size", 1) or 1), []
        facts = _pools.pool_facts(self._rank_facts(sharded=name in _pools.RANK_SHARDED), name, host_pool, mode,
                                  page, sizes)
        pool = _pools.Pool(name, host_pool, _pools.namespace(self.prefix, self._slug(), facts), mode, page,
                           len(sizes) if mode == _pools.SEGMENTS else 0, sum(sizes))
        self.pools[name] = pool
        log.info("kvtier HiCache backend: pool %s, namespace %s, %d-byte pages (%s)", name, pool.namespace,
                 pool.page_bytes, mode)

    def on_host_pools_registered(self) -> None:
        log.info("kvtier HiCache backend: pools %s", ", ".join(f"{n} ({p.mode})" for n, p in self.pools.items()))

    def batch_exists_v2(self, keys: list[str], pool_transfers=None, extra_info=None):
        from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransferResult

        try:
            kv_pages, final, hits, restorable = self._exists_v2(list(keys), list(pool_transfers or []))
            if kv_pages:
                hits = {PoolName.KV: kv_pages, **hits}
            return PoolTransferResult(final, hits, restorable)
        except Exception as e:  # noqa: BLE001
            self._failed("exists", e)
            return PoolTransferResult(0, {}, [])

    def _exists_v2(self, keys: list, transfers: list) -> tuple[int, int, dict, list[int]]:
        """The KV pages found, the hit, each pool's own boundary, and the lengths
        every pool can restore (the hit the longest of them)."""
        deadline = time.monotonic() + self.timeout
        self.stats["exists"] += 1
        bkeys = [self._key(k) for k in keys]
        kv_pages = len(bkeys) if self.kv_logical else self._lookup(self.namespace, bkeys, deadline)
        hits: dict = {}
        bounds: list[int] = []
        trailing: list[_pools.Trailing] = []
        for t in transfers if kv_pages else []:
            name, policy = _pools.name_of(t.name), _pools.policy_of(t)
            pool = self.pools.get(name)
            if policy == _pools.BLOCK_GROUPS or (pool is not None and pool.mode == _pools.NONE):
                continue  # never gates the hit (SGLang's contract) / no bytes to miss
            if pool is None or pool.mode == _pools.BROKEN:
                self._warn("pool", "kvtier HiCache backend: pool %s not registered or unusable: no hit", name)
                bounds.append(0)
                continue
            if policy == _pools.TRAILING_PAGES:
                tr = _pools.Trailing(max(1, len(t.keys or [])), self._prober(pool.namespace, bkeys, deadline))
                trailing.append(tr)
                boundary = _pools.verdict(tr, kv_pages)
            else:  # ALL_PAGES, and the strictest reading of any policy added later
                boundary = self._lookup(pool.namespace, bkeys[:kv_pages], deadline)
                bounds.append(boundary)
            if boundary:
                hits[t.name] = boundary
        final, restorable = _pools.fold(kv_pages, bounds, trailing)
        self.stats["hit_pages"] += final
        return kv_pages, final, hits, restorable

    def _lookup(self, namespace: str, keys: list[bytes], deadline: float) -> int:
        self.stats["pool_lookups"] += 1
        return self.client.lookup(namespace, keys=keys, timeout=self._left(deadline)).found

    def _prober(self, namespace: str, keys: list[bytes], deadline: float):
        """Lookups for one TRAILING_PAGES pool: how many of the ``n`` pages before
        length ``p`` are present, counting down from page p-1 (read backwards,
        a Lookup's leading run is the run of pages present that ends the window)."""
        used = [0]

        def lookup(p: int, n: int) -> int | None:
            if used[0] >= _pools.TRAILING_PROBES or deadline - time.monotonic() < 0.001:
                return None
            used[0] += 1
            return self._lookup(namespace, keys[p - n:p][::-1], deadline)

        return lookup

    def batch_get_v2(self, transfers, extra_info=None) -> dict:
        deadline = time.monotonic() + self.timeout
        return {t.name: self._pool_io("get", t, extra_info, deadline) for t in transfers}

    def batch_set_v2(self, transfers, extra_info=None) -> dict:
        deadline = time.monotonic() + self.timeout
        return {t.name: self._pool_io("set", t, extra_info, deadline) for t in transfers}

    def _pool_io(self, what: str, t, extra_info, deadline: float) -> list[bool]:
        keys = list(t.keys or [])
        if not keys:
            return []
        try:
            name = _pools.name_of(t.name)
            pool = self.pools.get(name)
            if pool is None or pool.mode == _pools.BROKEN:
                raise ValueError(f"pool {name} not registered or its pages cannot be moved")
            idx = t.host_indices
            if idx is None or idx.numel() != len(keys) * pool.page_size:
                raise ValueError(f"pool {name}: {0 if idx is None else idx.numel()} host indices for "
                                 f"{len(keys)} pages of {pool.page_size}")
            if pool.mode == _pools.NONE:
                return [True] * len(keys)
            if what == "get":
                return self._pool_get(pool, keys, idx, deadline)
            linked = _pools.policy_of(t) == _pools.ALL_PAGES
            return self._pool_set(pool, keys, idx, extra_info, linked, deadline)
        except Exception as e:  # noqa: BLE001
            self._failed(what, e)
            return [False] * len(keys)

    def _pool_get(self, pool: _pools.Pool, keys: list, idx, deadline: float) -> list[bool]:
        self.stats["pool_get_pages"] += len(keys)
        flat = pool.mode == _pools.FLAT
        bufs = [pool.host.get_dummy_flat_data_page() for _ in keys] if flat else []
        dests: list = [_pools.flat_view(b) for b in bufs] if flat else pool.segments(idx)
        r = self.client.read_into(pool.namespace, [self._key(k) for k in keys], dests, timeout=self._left(deadline))
        n = self._loaded(r, keys, pool.page_bytes)
        for i in range(n if flat else 0):
            pool.host.set_from_flat_data_page(pool.first_index(idx, i), bufs[i])
        self.stats["pool_loaded_pages"] += n
        return [i < n for i in range(len(keys))]

    def _pool_set(self, pool: _pools.Pool, keys: list, idx, extra_info, linked: bool, deadline: float) -> list[bool]:
        self.stats["pool_set_pages"] += len(keys)
        if pool.mode == _pools.FLAT:
            payloads: list = [_pools.flat_view(pool.host.get_data_page(pool.first_index(idx, i), flat=True))
                              for i in range(len(keys))]
        else:
            payloads = pool.segments(idx)
        # A pool a hit needs every page of is chained as the KV pages are. The
        # pages of a trailing window stand alone: kvtier evicts a chain from its
        # tail, which would drop the window a hit reads before the pages no hit
        # reads, and deleting one page would take the pages after it along.
        blocks = self._chain(keys, payloads, extra_info, linked)
        ok = [sum(len(p) for p in b.payload) == pool.page_bytes if isinstance(b.payload, list)
              else len(b.payload) == pool.page_bytes for b in blocks]
        good = [b for b, o in zip(blocks, ok) if o]
        stored = iter(self._store(good, pool.namespace, deadline) if good else [])
        return [o and next(stored) for o in ok]

    # -- the older interface ----------------------------------------------------------------

    def get(self, key: str, target_location: Any | None = None, target_sizes: Any | None = None):
        """The page's bytes into ``target_location`` (a tensor) when given; returns it, or ``None``."""
        if self.kv_logical:  # a logical KV anchor has no bytes to load
            return target_location
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
        if self.kv_logical:  # nothing to store: the pages are in the v2 pools
            return True
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
