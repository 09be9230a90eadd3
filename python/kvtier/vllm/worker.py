"""The worker half of the connector: reads found blocks into the block ids vLLM
allocated, and stores newly computed blocks without stalling the forward pass.

Loads (``LoadSpec``) arrive with each step's metadata:

* ``sync``: read and copy before the forward pass (``start_load_kv``);
* ``layerwise``: the read starts in ``start_load_kv`` on a thread, and each
  layer is copied in ``wait_for_layer_load`` just before its attention;
* ``async``: a thread reads and copies while the request waits off the batch;
  ``get_finished`` reports it done.

Every block that could not be loaded (kvtier gone mid-read, a lapsed lease, a
payload of the wrong size, a checksum mismatch) is reported through
``get_block_ids_with_load_errors``, so vLLM recomputes it: the output stays
correct, only slower. The blocks a request computed in the step its load
failed attended to stale KV: they are not stored.

Saves (``SaveSpec``) are copied out of vLLM's cache at the end of the step
(``wait_for_save``: a memcpy, so the blocks may be reused right after) and sent
by one background thread in order (parents before children). If more than
``max_pending_save_mib`` wait, or kvtier is down, new saves are dropped:
a later miss, never a stall.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import grpc

from ..client import Block
from ..errors import KvtierError
from ..pins import HostPins
from .common import Breaker, LoadSpec, SaveSpec, StatsLog, is_outage, log
from .config import ConnectorConfig
from .layout import PayloadLayout
from .mapped import MappedLoad

__all__ = ["WorkerSide"]


class WorkerSide:
    """Worker-role logic of :class:`kvtier.vllm.KvtierConnector`."""

    def __init__(self, cfg: ConnectorConfig, namespace: str, client, layer_names: list[str], block_size: int,
                 stats: StatsLog, log_transport: bool = True, state: bool = False):
        self.cfg = cfg
        self.state = state  # a Mamba / linear-attention state group (docs/vllm.md, "Hybrid models")
        self.log_transport = log_transport  # (a hybrid model's other groups stay quiet: one line per worker)
        self.namespace = namespace
        self.client = client
        self.layer_names = layer_names
        self.layer_index = {n: i for i, n in enumerate(layer_names)}
        self.block_size = block_size
        self.stats = stats
        self.breaker = Breaker(cfg.url, cfg.retry_initial_ms / 1000, cfg.retry_max_ms / 1000)
        self.layout: PayloadLayout | None = None
        self._errors: set[int] = set()
        self._failed_reqs: set[str] = set()  # requests whose load failed this step (not async)
        self._failed_async: set[str] = set()  # async loads that failed (failed_recving)
        self._lock = threading.Lock()
        # async loads
        self._loader = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvtier-load")
        self._async: dict[str, Future] = {}
        self._done_recving: set[str] = set()
        # layer-wise loads of the current step: [(spec, future of payloads)]
        self._layerwise: list[tuple[LoadSpec, Future]] = []
        self._layers_done: set[int] = set()
        # saves
        self._pending = 0  # bytes of queued writes
        self._pending_cap = cfg.max_pending_save_mib << 20
        self._outstanding = 0  # queued background operations not yet finished
        self._idle = threading.Condition(self._lock)
        self._queue: queue.Queue = queue.Queue()
        self._transport: str | None = None  # logged once, by the first read or write that works
        self._sender = threading.Thread(target=self._send_loop, name="kvtier-save", daemon=True)
        self._sender.start()
        self.counters = {"loaded_blocks": 0, "failed_blocks": 0, "saved_blocks": 0, "dropped_blocks": 0}

    def register(self, kv_caches) -> None:
        # vLLM (0.32+) hands a Mamba / linear-attention layer over as a
        # [B, 1, 1, state bytes] view: one "token" per block, the state at
        # its boundary. Its payload is that one-token tile per layer.
        tokens = kv_caches[self.layer_names[0]].shape[2] if self.state else self.block_size
        self.layout = PayloadLayout(kv_caches, self.layer_names, tokens)
        self._pins = HostPins(self.layout.device.type == "cuda")
        log.info("kvtier connector: namespace %s, %d-byte payload per %d-token block (%s)",
                 self.namespace, self.layout.nbytes, self.block_size, self.layout.describe())
        self.stats("init", namespace=self.namespace, state=self.state, **self.layout.describe())

    @property
    def _layout(self) -> PayloadLayout:
        """The layout, for the load path: loads start only once it exists (``start_load``)."""
        if self.layout is None:
            raise RuntimeError("kvtier connector: KV caches not registered")
        return self.layout

    # -- loading ----------------------------------------------------------

    def _fail(self, spec: LoadSpec, start: int, why: str) -> None:
        bad = spec.block_ids[start:]
        if not bad:
            return
        with self._lock:
            self._errors.update(bad)
            if not spec.is_async:
                self._failed_reqs.add(spec.req_id)
            else:
                self._failed_async.add(spec.req_id)
        self.counters["failed_blocks"] += len(bad)
        log.warning("kvtier: %d of %d blocks of request %s not loaded (%s); vLLM recomputes them",
                    len(bad), len(spec.block_ids), spec.req_id, why)

    def _read(self, spec: LoadSpec):
        """Reads the blocks of ``spec``: (payloads of the leading blocks read and
        checked, why the rest are missing or "", the staging buffer whose rows
        hold those payloads, or None when they are ``bytes`` or already in
        vLLM's cache: read in place where the layout allows it,
        ``PayloadLayout.loads_in_place``, each payload then a list of the
        regions it filled)."""
        if not self.breaker.allow():
            return [], "kvtier unreachable", None
        lease = spec.leases.get(self.namespace, 0)
        # A cluster client needs the node that granted the scheduler's lease.
        node = {"lease_node": spec.lease_nodes[self.namespace]} if self.namespace in spec.lease_nodes else {}
        # The payloads land in vLLM's cache itself where each layer's tile is
        # one range of memory, else in host rows: pinned memory on a GPU
        # (notes/018: one copy fewer before the transfer). On the same-host
        # socket they are copied there out of kvtier's shared memory, or on
        # a GPU DMA'd from it (load_mapped; docs/local.md).
        layout = self._layout
        host = None
        timeout = self.cfg.load_timeout_ms / 1000
        try:
            try:
                # Inside the try: deciding asks the client which transport it
                # has, which discovers the server on first use and may fail
                # like the read itself (an outage, counted once).
                if self._mapped():
                    # Left in kvtier's shared memory, DMA'd from (docs/vllm.md, load_mapped).
                    m = self.client.map_read(self.namespace, spec.keys, lease_id=lease, timeout=timeout)
                    host = MappedLoad(m, self._pins)
                    r = SimpleNamespace(reason=host.reason, blocks=[
                        SimpleNamespace(key=k, payload=p) for k, p in zip(host.keys, host.payloads)])
                else:
                    if layout.loads_in_place and self._in_place():
                        dests = layout.block_regions(spec.block_ids)
                    else:
                        host = layout.staging_rows(len(spec.keys))
                        dests = [host[i].numpy() for i in range(len(spec.keys))]
                    r = self.client.read_into(self.namespace, spec.keys, dests, lease_id=lease, timeout=timeout,
                                              **node)
                self._say_transport()
            except KvtierError as e:
                if e.code != grpc.StatusCode.INVALID_ARGUMENT:
                    raise
                # A block larger than a row (not this model's KV): read as
                # bytes to find it; it is deleted below.
                self._release_host(host)
                host = None
                r = self.client.read(self.namespace, spec.keys, lease_id=lease, timeout=timeout, **node)
        except Exception as e:  # noqa: BLE001 - every failure is a recompute
            self._release_host(host)
            if is_outage(e):
                self.breaker.failure(e)
            return [], str(e), None
        finally:
            if lease:
                self._submit("release", (lease, node))
        self.breaker.success()
        payloads = []
        why = ""
        for b in r.blocks:
            size = sum(len(p) for p in b.payload) if isinstance(b.payload, list) else len(b.payload)
            if size != layout.nbytes:
                why = (f"block {b.key.hex()} has {size} bytes, expected {layout.nbytes}: "
                       "not this model's KV; deleted so it can be stored again")
                self._submit("delete", [b.key])
                break
            payloads.append(b.payload)
        if not why and len(payloads) < len(spec.keys):
            why = f"kvtier returned {len(payloads)} of {len(spec.keys)} blocks ({r.reason or 'missing'})"
        return payloads, why, host

    def _load_now(self, spec: LoadSpec) -> None:
        t0 = time.perf_counter()
        payloads, why, host = self._read(spec)
        t1 = time.perf_counter()
        # A read lands either all in place (each payload the list of regions
        # it filled) or all as bytes or staging rows, copied in now.
        in_place = bool(payloads) and isinstance(payloads[0], list)
        try:
            if isinstance(host, MappedLoad):
                self._layout.scatter_pinned(spec.block_ids[:len(payloads)], payloads)
            elif not in_place:
                self._layout.scatter_many(spec.block_ids[:len(payloads)], payloads, host=host)
        finally:
            self._release_host(host)
        t2 = time.perf_counter()
        self._fail(spec, len(payloads), why)
        self.counters["loaded_blocks"] += len(payloads)
        self.stats("load", req=spec.req_id, mode="async" if spec.is_async else "sync", blocks=len(spec.keys),
                   loaded=len(payloads), error=why, read_us=int((t1 - t0) * 1e6), copy_us=int((t2 - t1) * 1e6),
                   bytes=len(payloads) * self._layout.nbytes, in_place=len(payloads) if in_place else 0)

    def start_load(self, loads: list[LoadSpec]) -> None:
        if self.layout is None:
            for spec in loads:
                self._fail(spec, 0, "KV caches not registered")
                if spec.is_async:
                    with self._lock:
                        self._done_recving.add(spec.req_id)
            return
        for spec in loads:
            if spec.is_async and not spec.keys:
                # (a hybrid model's group with nothing to load at this hit)
                if spec.leases.get(self.namespace):
                    node = {"lease_node": spec.lease_nodes[self.namespace]} if self.namespace in spec.lease_nodes else {}
                    self._submit("release", (spec.leases[self.namespace], node))
                with self._lock:
                    self._done_recving.add(spec.req_id)
            elif spec.is_async:
                self._async[spec.req_id] = self._loader.submit(self._load_async, spec)
            elif self.cfg.load_mode == "layerwise":
                self._layerwise.append((spec, self._loader.submit(self._read_timed, spec)))
            else:
                self._load_now(spec)
        self._layers_done = set()

    def _load_async(self, spec: LoadSpec) -> None:
        try:
            self._load_now(spec)
        except Exception as e:  # noqa: BLE001
            self._fail(spec, 0, f"load failed: {e}")
        finally:
            with self._lock:
                self._done_recving.add(spec.req_id)

    def _read_timed(self, spec: LoadSpec):
        t0 = time.perf_counter()
        # Read in place where the layout allows: every layer is then in
        # vLLM's cache once the read is, and no layer waits for a copy.
        payloads, why, host = self._read(spec)
        return payloads, why, int((time.perf_counter() - t0) * 1e6), host

    def wait_for_layer_load(self, layer_name: str) -> None:
        if not self._layerwise:
            return
        layer = self.layer_index.get(layer_name)
        if layer is None or layer in self._layers_done:
            return
        for spec, fut in self._layerwise:
            payloads, _, _, _ = fut.result()
            for bid, p in zip(spec.block_ids, payloads):
                if not isinstance(p, list):  # a list: read in place, already there
                    self._layout.scatter_layer(layer, bid, p)
        self._layers_done.add(layer)

    def _finish_layerwise(self) -> None:
        """End of a step with layer-wise loads: report what failed; a layer that
        was never copied in means its attention read stale KV, so the whole load
        counts as failed."""
        all_layers = len(self._layers_done) == len(self.layer_names)
        for spec, fut in self._layerwise:
            payloads, why, read_us, host = fut.result()
            self._release_host(host)  # every layer that will be copied in has been
            if not all_layers and payloads:
                payloads, why = [], f"{len(self.layer_names) - len(self._layers_done)} layers were not copied in time"
            self._fail(spec, len(payloads), why)
            self.counters["loaded_blocks"] += len(payloads)
            self.stats("load", req=spec.req_id, mode="layerwise", blocks=len(spec.keys), loaded=len(payloads),
                       error=why, read_us=read_us, bytes=len(payloads) * self._layout.nbytes)
        self._layerwise = []

    def get_finished(self) -> set[str]:
        with self._lock:
            done, self._done_recving = self._done_recving, set()
        for req_id in done:
            self._async.pop(req_id, None)
        return done

    def take_failed(self) -> set[str]:
        """Requests whose async load failed since the last call (a subset of
        what ``get_finished`` reported or reports next)."""
        with self._lock:
            failed, self._failed_async = self._failed_async, set()
        return failed

    def take_errors(self) -> set[int]:
        with self._lock:
            errors, self._errors = self._errors, set()
        return errors

    # -- saving -----------------------------------------------------------

    def save(self, saves: list[SaveSpec], forget: list[bytes] | tuple = ()) -> None:
        """End of step: copy the saved blocks out of vLLM's cache, queue the
        writes (after deleting ``forget``). A request whose load failed in
        this step computed its new blocks from stale KV: they are not stored."""
        if self._layerwise:
            self._finish_layerwise()
        with self._lock:
            failed, self._failed_reqs = self._failed_reqs, set()
        if self.layout is None:
            return
        if forget:
            self._submit("delete", list(forget))
        if failed:
            stale = sum(len(s.block_ids) for s in saves if s.req_id in failed)
            if stale:
                saves = [s for s in saves if s.req_id not in failed]
                self.stats("save_dropped", blocks=stale, why="computed after a failed load")
        if not saves:
            return
        n = sum(len(s.block_ids) for s in saves)
        size = n * self.layout.nbytes
        if not self.breaker.allow() or self._pending + size > self._pending_cap:
            self.counters["dropped_blocks"] += n
            self.stats("save_dropped", blocks=n, why="kvtier unreachable" if self.breaker.down else "queue full")
            return
        t0 = time.perf_counter()
        block_ids = [b for s in saves for b in s.block_ids]
        data = self.layout.gather(block_ids)
        gather_us = int((time.perf_counter() - t0) * 1e6)
        blocks = []
        row = 0
        bs = self.block_size
        for s in saves:
            for i, key in enumerate(s.keys):
                parent = None if not s.chained else s.keys[i - 1] if i else s.parent
                blocks.append(Block(key=key, payload=memoryview(data[row].numpy()), parent=parent,
                                    token_count=bs, token_ids=s.tokens[i * bs:(i + 1) * bs]))
                row += 1
        self._submit("write", blocks, size)
        self.stats("save", blocks=n, gather_us=gather_us, bytes=size)

    def _submit(self, op: str, arg, size: int = 0) -> None:
        with self._lock:
            self._pending += size
            self._outstanding += 1
        self._queue.put((op, arg, size))

    def _send_loop(self) -> None:
        """Background sender: writes in submission order, plus lease releases and deletes."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            op, arg, size = item
            try:
                if op == "write":
                    self._write(arg)
                elif op == "release":
                    self.client.release(arg[0], timeout=self.cfg.save_timeout_ms / 1000, **arg[1])
                elif op == "delete":
                    self.client.delete(self.namespace, arg, timeout=self.cfg.save_timeout_ms / 1000)
            except Exception as e:  # noqa: BLE001
                log.debug("kvtier background %s failed: %s", op, e)
            finally:
                with self._lock:
                    self._pending -= size
                    self._outstanding -= 1
                    self._idle.notify_all()

    def _pool(self):
        """The client's data plane (discovered on first use), or None: over
        gRPC, or a cluster client, which has one per node."""
        return self.client.data_plane() if hasattr(self.client, "data_plane") else None

    def _release_host(self, host) -> None:
        """Gives back what a read landed in: staging rows, or a mapped read's slots."""
        if isinstance(host, MappedLoad):
            host.release()
        elif host is not None:
            self._layout.release_rows(host)

    def _mapped(self) -> bool:
        """Whether reads stay in kvtier's shared memory, DMA'd from (``load_mapped``)."""
        if self.cfg.load_mapped != "auto":
            return self.cfg.load_mapped == "always"
        pool = self._pool()
        return (self._layout.device.type == "cuda" and pool is not None and pool.transport == "unix"
                and pool.copies_by_memory)

    def _in_place(self) -> bool:
        """Whether reads go straight into vLLM's cache (``load_in_place``)."""
        if self.cfg.load_in_place != "auto":
            return self.cfg.load_in_place == "always"
        pool = self._pool()
        return pool is not None and pool.copies_by_memory

    def _say_transport(self) -> None:
        """Once per worker, after the first read or write that worked: which
        way the blocks move (docs/local.md). A silent fallback to a slower
        path is what users of the peers report most."""
        if self._transport is not None:
            return
        pool = self._pool()
        self._transport = pool.transport if pool is not None else "grpc"
        how = {"unix": "kvtier's same-host socket (blocks through kvtier's shared memory"
                       + (", DMA'd by the GPU from it)" if self._mapped() else ")"),
               "tcp": "kvtier's TCP data plane", "grpc": "gRPC (the server offers no data plane)"}
        if self.log_transport:
            log.info("kvtier connector (worker %s): blocks move over %s", self.namespace,
                     how.get(self._transport, self._transport))
        self.stats("transport", transport=self._transport)

    def _write(self, blocks: list[Block]) -> None:
        if not self.breaker.allow():
            self.counters["dropped_blocks"] += len(blocks)
            return
        t0 = time.perf_counter()
        timeout = self.cfg.save_timeout_ms / 1000
        stored = existing = conflicts = 0
        try:
            try:
                r = self.client.write(self.namespace, blocks, timeout=timeout)
                stored, existing = r.stored, r.existing
                self._say_transport()
            except KvtierError as e:
                if e.code != grpc.StatusCode.FAILED_PRECONDITION or len(blocks) == 1:
                    raise
                # A block is already stored with other bytes (another engine
                # computed the same prefix: GPU kernels need not be bit-exact).
                # The first writer wins; store the others one by one.
                for b in blocks:
                    try:
                        r = self.client.write(self.namespace, [b], timeout=timeout)
                        stored += r.stored
                        existing += r.existing
                    except KvtierError as e1:
                        if e1.code != grpc.StatusCode.FAILED_PRECONDITION:
                            raise
                        conflicts += 1
        except Exception as e:  # noqa: BLE001
            if is_outage(e):
                self.breaker.failure(e)
            else:
                log.warning("kvtier: storing %d blocks failed: %s", len(blocks), e)
            self.counters["dropped_blocks"] += len(blocks) - stored - existing
            self.stats("write", blocks=len(blocks), error=str(e), us=int((time.perf_counter() - t0) * 1e6))
            return
        self.breaker.success()
        self.counters["saved_blocks"] += stored
        self.stats("write", blocks=len(blocks), stored=stored, existing=existing, conflicts=conflicts,
                   us=int((time.perf_counter() - t0) * 1e6))

    def flush(self, timeout: float = 30.0) -> bool:
        """Waits until every queued save was sent (tests, shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._outstanding == 0, timeout)

    def shutdown(self) -> None:
        self.flush(timeout=self.cfg.save_timeout_ms / 1000)
        self._queue.put(None)
        self._loader.shutdown(wait=False)

