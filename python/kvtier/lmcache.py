"""kvtier as an LMCache remote storage backend (``docs/lmcache.md``).

Enable it in LMCache's config::

    remote_storage_plugins: ["kvtier"]
    extra_config:
      remote_storage_plugin.kvtier.module_path: kvtier.lmcache
      remote_storage_plugin.kvtier.class_name: KvtierConnectorAdapter
      remote_storage_plugin.kvtier.url: kvtier://127.0.0.1:50051

How LMCache's operations map onto kvtier's:

* **Keys.** LMCache names a chunk by a ``CacheEngineKey``: model, world size,
  worker id, a prefix hash of the chunk's tokens, dtype and tags. Everything
  but the hash goes into the kvtier namespace (hashed, with the chunk shapes,
  dtypes, memory format and this payload format's version), so a different
  model, rank, dtype or layout never sees another's chunks; the hash is the
  kvtier key. LMCache's chunk hashes already chain over the prefix, so "how
  many leading chunks exist" is one kvtier Lookup.
* **Existence** in batches (``batched_async_contains``, ``batched_contains``):
  one Lookup for the run of consecutive chunks, with a lease when LMCache asks
  to pin them.
* **Gets** read each payload straight into a memory object allocated from
  LMCache's local CPU backend (``Client.read_into``: by the server itself on
  the same-host socket, no intermediate copy); a chunk whose size is not a
  whole number of tokens of this layout is a miss with a warning, never loaded.
* **Puts** send the memory object's bytes as they are (no copy on the data
  plane). The object's reference stays LMCache's: its connector wrapper
  releases it once the put returns.
* **Failures are misses.** No method raises into LMCache or waits past the
  configured timeout (below LMCache's own blocking timeout).

kvtier has no listing API: ``list()`` returns nothing.
"""
from __future__ import annotations

import asyncio
import builtins  # annotations say builtins.list: the class's own list() method shadows it there
import hashlib
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from .client import Client
from .results import Block

__all__ = ["KvtierConnectorAdapter", "KvtierRemoteConnector", "PAYLOAD_FORMAT"]

log = logging.getLogger("kvtier.lmcache")

SCHEME = "kvtier://"
PLUGIN = "kvtier"
#: Version of the payload layout: a chunk's raw bytes in LMCache's memory format.
PAYLOAD_FORMAT = "kvtier-lmcache-payload-v1"
_OPTIONS = {"url", "timeout_ms", "lease_ms", "namespace_prefix", "connections", "data_plane"}


def _plugin_type(name: str) -> str:
    return name.split(".", 1)[0]


class KvtierConnectorAdapter(ConnectorAdapter):
    """Accepts ``kvtier://HOST:PORT`` and ``plugin://kvtier[.instance]`` URLs.

    LMCache's plugin path dials ``plugin://kvtier``, a URL without an endpoint:
    the endpoint then comes from ``remote_storage_plugin.kvtier.url``. (An
    adapter that refused ``plugin://`` would make every operation a silent miss.)
    """

    def __init__(self, schema: str = SCHEME):
        super().__init__(schema)

    def can_parse(self, url: str) -> bool:
        if url.startswith(SCHEME):
            return True
        return url.startswith("plugin://") and _plugin_type(url[len("plugin://"):]) == PLUGIN

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        opts = _options(context)
        return KvtierRemoteConnector(
            url=opts["url"],
            loop=context.loop,
            local_cpu_backend=context.local_cpu_backend,
            config=context.config,
            metadata=context.metadata,
            timeout_ms=int(opts.get("timeout_ms", 5000)),
            lease_ms=int(opts.get("lease_ms", 30_000)),
            namespace_prefix=str(opts.get("namespace_prefix", "")),
            connections=int(opts.get("connections", 4)),
            data_plane=str(opts.get("data_plane", "true")).lower() not in ("0", "false", "no"),
        )


def _options(context) -> dict:
    """``remote_storage_plugin.<name>.*`` keys of LMCache's extra_config; the
    instance name first (``kvtier.primary``), then the bare type."""
    url = getattr(context, "url", "") or ""
    extra = getattr(getattr(context, "config", None), "extra_config", None) or {}
    pname = getattr(context, "plugin_name", None) or (url[len("plugin://"):] if url.startswith("plugin://") else PLUGIN)
    opts: dict = {}
    for name in (_plugin_type(pname), pname):
        prefix = f"remote_storage_plugin.{name}."
        opts.update({k[len(prefix):]: v for k, v in extra.items() if k.startswith(prefix)})
    unknown = sorted(set(opts) - _OPTIONS - {"module_path", "class_name"})
    if unknown:
        raise ValueError(f"kvtier LMCache plugin: unknown option(s) {unknown}; known: {sorted(_OPTIONS)}")
    if url.startswith(SCHEME):
        opts["url"] = url
    if not str(opts.get("url", "")).startswith(SCHEME):
        raise ValueError(
            f"kvtier LMCache plugin selected ({url!r}) but no endpoint: set extra_config "
            f"'remote_storage_plugin.{_plugin_type(pname)}.url' = 'kvtier://HOST:PORT'"
        )
    return opts


class _RateLimited:
    """At most one warning per key per interval (a dead kvtier must not flood the log)."""

    def __init__(self, interval: float = 30.0):
        self.interval = interval
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def warn(self, key: str, msg: str, *args) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -1e9) < self.interval:
                log.debug(msg, *args)
                return
            self._last[key] = now
        log.warning(msg, *args)


class KvtierRemoteConnector(RemoteConnector):
    """LMCache ``RemoteConnector`` backed by a kvtier server."""

    def __init__(self, url: str, loop, local_cpu_backend, config, metadata, timeout_ms: int = 5000,
                 lease_ms: int = 30_000, namespace_prefix: str = "", connections: int = 4,
                 data_plane: bool = True):
        super().__init__(config, metadata)
        if not re.fullmatch(r"[A-Za-z0-9._:/-]{0,48}", namespace_prefix):
            raise ValueError(f"kvtier LMCache plugin: bad namespace_prefix {namespace_prefix!r}")
        self.url = url
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.timeout = timeout_ms / 1000
        self.lease_ms = lease_ms
        self.prefix = namespace_prefix
        # The client dials lazily: constructing the connector needs no server.
        self.client = Client(url[len(SCHEME):], connections=connections, timeout=self.timeout, retries=1,
                             retry_shed=False, data_plane=data_plane)
        self._pool = ThreadPoolExecutor(max_workers=connections, thread_name_prefix="kvtier-lmcache")
        self._layout = json.dumps({
            "format": PAYLOAD_FORMAT,
            "shapes": [list(s) for s in self.meta_shapes],
            "dtypes": [str(d) for d in self.meta_dtypes],
            "fmt": str(self.meta_fmt),
            "chunk_bytes": self.full_chunk_size_bytes,
        }, sort_keys=True)
        self._ns_cache: dict[tuple, str] = {}
        self._warn = _RateLimited()
        self.stats = {"gets": 0, "hits": 0, "puts": 0, "put_failures": 0, "errors": 0, "bad_size": 0,
                      "leases_taken": 0, "leases_released": 0}
        # lookup_id -> (monotonic deadline, lease ids): the pins LMCache asked
        # for in batched_async_contains, released when the same lookup's
        # batched_get_non_blocking has read the chunks (LMCache calls both from
        # one coroutine). A lookup whose get never comes keeps its lease until
        # kvtier expires it (lease_ms); the entry is dropped by then too.
        self._leases: dict[str, tuple[float, list[int]]] = {}
        self._leases_lock = threading.Lock()
        self._init_drain(local_cpu_backend)

    # -- shutdown ---------------------------------------------------------------

    def _init_drain(self, local_cpu_backend) -> None:
        """Makes LMCache's local CPU backend wait for this connector's work
        before it closes.

        LMCache's ``StorageManager.close`` closes ``LocalCPUBackend`` (which
        frees the memory arena every memory object lives in) before the
        remote backend, and nothing waits for puts and gets still running on
        this connector's threads: a put still reading a chunk's bytes, or a
        get still receiving into one, then touches freed memory and the
        process dies with SIGSEGV (seen in CI: a put to a stopped kvtier,
        retrying while LMCache shut down). So the backend's ``close`` first
        waits, bounded, until nothing of ours is in flight."""
        self._busy = 0
        self._idle = threading.Condition()
        close = getattr(local_cpu_backend, "close", None)
        if close is None:
            return

        def drain_then_close(*args, **kwargs):
            if not self.drain():
                log.warning("kvtier: work still in flight after %.0f s; LMCache frees its memory anyway",
                            self._drain_timeout())
            return close(*args, **kwargs)

        local_cpu_backend.close = drain_then_close

    def _drain_timeout(self) -> float:
        # One operation's worst case: the client's timeout per attempt, two attempts, and backoff.
        return 2 * self.timeout + 2

    def drain(self, timeout: float | None = None) -> bool:
        """Waits until no operation of this connector is in flight; False if
        ``timeout`` (default: one operation's worst case) passed first."""
        deadline = time.monotonic() + (self._drain_timeout() if timeout is None else timeout)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self.loop and self.loop.is_running():
            # A put LMCache submitted just before shutting down may not have
            # started yet: one no-op through its loop (FIFO) lets every
            # coroutine submitted earlier reach ``_run`` and be counted.
            try:
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop).result(
                    max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - the loop is going away: nothing more will start
                pass
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, max(0.0, deadline - time.monotonic()))

    def _done(self) -> None:
        with self._idle:
            self._busy -= 1
            if self._busy == 0:
                self._idle.notify_all()

    # -- keys and namespaces ------------------------------------------------------

    def namespace(self, key) -> str:
        ident = (key.model_name, key.world_size, key.worker_id, str(key.dtype), key.tags)
        ns = self._ns_cache.get(ident)
        if ns is None:
            digest = hashlib.sha256(json.dumps([repr(ident), self._layout]).encode()).hexdigest()[:20]
            slug = re.sub(r"[^A-Za-z0-9._-]", "-", str(key.model_name).rstrip("/").split("/")[-1])[:40] or "model"
            ns = f"{self.prefix}lmcache/{slug}/{digest}"
            self._ns_cache[ident] = ns
        return ns

    @staticmethod
    def kvkey(key) -> bytes:
        return key.chunk_hash_hex.encode()

    def _groups(self, keys) -> list[tuple[str, list]]:
        """Consecutive runs of keys sharing a namespace (normally one)."""
        out: list[tuple[str, list]] = []
        for k in keys:
            ns = self.namespace(k)
            if out and out[-1][0] == ns:
                out[-1][1].append(k)
            else:
                out.append((ns, [k]))
        return out

    # -- plumbing ---------------------------------------------------------------

    async def _run(self, what: str, fn, default):
        """Runs blocking ``fn`` on the connector's threads; any failure is
        ``default``. ``fn`` counts as in flight (see ``drain``) from now until
        it has returned on its thread, even if the awaiting coroutine is
        cancelled first."""
        with self._idle:
            self._busy += 1

        def job():
            try:
                return fn()
            finally:
                self._done()

        try:
            try:
                fut = asyncio.get_running_loop().run_in_executor(self._pool, job)
            except BaseException:
                self._done()  # never submitted
                raise
            return await fut
        except Exception as e:  # noqa: BLE001 - a failure is a miss, never an exception into LMCache
            self.stats["errors"] += 1
            self._warn.warn(what, "kvtier %s failed (treated as a miss): %s", what, e)
            return default

    def _sync(self, what: str, fn, default):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            self.stats["errors"] += 1
            self._warn.warn(what, "kvtier %s failed (treated as a miss): %s", what, e)
            return default

    def _found(self, keys, pin_for: str | None = None) -> int:
        """Leading chunks present; with ``pin_for`` (a lookup id) they are
        leased until that lookup's read releases them."""
        found = 0
        taken: list[int] = []
        try:
            for ns, ks in self._groups(keys):
                r = self.client.lookup(ns, keys=[self.kvkey(k) for k in ks],
                                       lease_ms=self.lease_ms if pin_for is not None else 0)
                found += r.found
                if r.lease_id:
                    taken.append(r.lease_id)
                if r.found < len(ks):
                    break
        finally:
            if taken:
                self.stats["leases_taken"] += len(taken)
                if pin_for is not None:  # always: only a pinned lookup asks for leases
                    self._remember(pin_for, taken)
        return found

    def _remember(self, lookup_id: str, lease_ids: list[int]) -> None:
        now = time.monotonic()
        with self._leases_lock:
            stale = [k for k, (deadline, _) in self._leases.items() if deadline < now]
            for k in stale:
                del self._leases[k]
            # A repeated lookup replaces (and releases) what the previous one pinned.
            _, old = self._leases.pop(lookup_id, (0.0, []))
            self._leases[lookup_id] = (now + self.lease_ms / 1000, lease_ids)
        self._release(old)

    def _release_lookup(self, lookup_id: str) -> None:
        with self._leases_lock:
            _, ids = self._leases.pop(lookup_id, (0.0, []))
        self._release(ids)

    def _release(self, lease_ids: list[int]) -> None:
        for lid in lease_ids:
            try:
                self.client.release(lid)
                self.stats["leases_released"] += 1
            except Exception as e:  # noqa: BLE001 - an unreleased lease expires on its own
                self._warn.warn("release", "kvtier lease %d not released (it expires by itself): %s", lid, e)

    def _size_ok(self, n: int) -> bool:
        return 0 < n <= self.full_chunk_size_bytes and n % self.single_token_size == 0

    def _read(self, keys) -> list:
        """Memory objects of the leading chunks of ``keys`` that kvtier holds and
        that fit this layout; each payload read straight into its object.

        The objects are allocated first, one full chunk each (a chunk is at
        most that), and named to one ``read_into``: on the same-host socket
        each chunk is copied into its object out of kvtier's shared memory,
        over TCP it is
        received into it; no ``bytes`` in between (notes/060). A retried
        read fills the same objects again. Objects of chunks not loaded go
        back to LMCache's allocator."""
        out: list = []
        for ns, ks in self._groups(keys):
            objs: list = []
            try:
                for _ in ks:
                    obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt,
                                                          busy_loop=False)
                    if obj is None:  # LMCache's memory is full: read what has room
                        break
                    objs.append(obj)
                r = self.client.read_into(ns, [self.kvkey(k) for k in ks[:len(objs)]],
                                          [o.byte_array for o in objs]) if objs else None
            except BaseException:
                for obj in objs:
                    obj.ref_count_down()
                raise
            blocks = [] if r is None else r.blocks
            loaded = 0
            for b in blocks:
                n = len(b.payload)
                if not self._size_ok(n):
                    self.stats["bad_size"] += 1
                    self._warn.warn("size", "kvtier chunk %s in %s has %d bytes, not a whole number of "
                                    "%d-byte tokens up to %d: not loaded", b.key.decode(errors="replace"), ns,
                                    n, self.single_token_size, self.full_chunk_size_bytes)
                    break
                obj = objs[b.index]
                out.append(self.reshape_partial_chunk(obj, n) if n < self.full_chunk_size_bytes else obj)
                loaded += 1
            for obj in objs[loaded:]:
                obj.ref_count_down()
            if loaded < len(ks):
                break
        return out

    def _write(self, keys, memory_objs) -> None:
        # The objects' references belong to the caller: LMCache's
        # InstrumentedRemoteConnector drops them once put/batched_put returns,
        # failed or not. Dropping them here too was a double free (the buffer
        # went back to LMCache's allocator while still cached).
        try:
            by_ns: dict[str, list] = {}
            for k, obj in zip(keys, memory_objs):
                by_ns.setdefault(self.namespace(k), []).append(Block(key=self.kvkey(k), payload=obj.byte_array))
            for ns, blocks in by_ns.items():
                self.client.write(ns, blocks)
            self.stats["puts"] += len(keys)
        except Exception:
            self.stats["put_failures"] += len(keys)
            raise

    # -- RemoteConnector -------------------------------------------------------

    async def exists(self, key) -> bool:
        return await self._run("exists", lambda: self._found([key]) == 1, False)

    def exists_sync(self, key) -> bool:
        return self._sync("exists", lambda: self._found([key]) == 1, False)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: builtins.list) -> int:
        return self._sync("contains", lambda: self._found(keys), 0)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: builtins.list, pin: bool = False) -> int:
        return await self._run("contains", lambda: self._found(keys, lookup_id if pin else None), 0)

    async def get(self, key) -> Any | None:
        self.stats["gets"] += 1
        objs = await self._run("get", lambda: self._read([key]), [])
        self.stats["hits"] += len(objs)
        return objs[0] if objs else None

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: builtins.list) -> builtins.list:
        self.stats["gets"] += len(keys)
        try:
            objs = await self._run("get", lambda: self._read(keys), [])
        finally:
            # The chunks are read (or will not be): the lookup's pins are done.
            await self._run("release", lambda: self._release_lookup(lookup_id), None)
        self.stats["hits"] += len(objs)
        return objs

    async def put(self, key, memory_obj) -> None:
        await self._run("put", lambda: self._write([key], [memory_obj]), None)

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: builtins.list, memory_objs: builtins.list) -> None:
        await self._run("put", lambda: self._write(list(keys), list(memory_objs)), None)

    def remove_sync(self, key) -> bool:
        return self._sync("remove", lambda: self.client.delete(self.namespace(key), [self.kvkey(key)]).deleted > 0,
                          False)

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        return await self._run("ping", lambda: (self.client.stats(), 0)[1], 1)

    async def list(self) -> builtins.list[str]:
        return []

    async def close(self) -> None:
        self.drain()
        self._pool.shutdown(wait=False)
        self.client.close()

    def __repr__(self) -> str:
        return f"<KvtierRemoteConnector {self.url}>"
