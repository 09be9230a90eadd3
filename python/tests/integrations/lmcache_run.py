"""Runs LMCache's engine (standalone, with its mock GPU connector: the only
LMCache path that runs without a GPU) against kvtier through the kvtier
storage plugin, in a process of its own: ``python lmcache_run.py SPEC OUT``.

The mock connector moves no data, so this runner gives it some: on store
each chunk's memory object is filled with a pattern derived from its token
positions, and on retrieve the pattern is checked, so the test sees every
byte that went through kvtier. Modes:

* ``store``: store the tokens; wait until kvtier holds every chunk.
* ``retrieve``: look the tokens up and retrieve them (a fresh process: LMCache's
  own CPU cache is empty, so everything comes from kvtier).
* ``outage``: store, then wait for the test to stop kvtier (``go`` file), then
  look up, retrieve and store again: all must be misses, none may hang.
* ``pin``: store, then do what LMCache's async loading does (one lookup id:
  ``batched_async_contains(pin=True)``, then ``batched_get_non_blocking``)
  and report the server's active leases after each step.
"""
from __future__ import annotations

import json
import os
import sys
import time


def pattern(t, start: int, end: int):
    import torch

    pos = torch.arange(start, end, dtype=torch.float32)
    vals = (pos % 251) / 8.0
    view = t.view(t.shape[0], t.shape[1], t.shape[2], -1)  # [kv, layers, tokens, hidden]
    return vals.view(1, 1, -1, 1).expand_as(view).to(t.dtype)


def main(spec_path: str, out_path: str) -> None:
    spec = json.load(open(spec_path))
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.gpu_connector.mock_gpu_connector import MockGPUConnector
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.standalone.__main__ import LMCacheStandaloneStarter, parse_kvcache_shape_spec

    checked = {"chunks": 0, "bad": 0}

    def from_gpu(self, memory_objs, starts, ends, **kw):
        for obj, s, e in zip(memory_objs, starts, ends):
            t = obj.tensor
            t.copy_(pattern(t, s, e).view_as(t))

    def to_gpu(self, memory_objs, starts, ends, **kw):
        for obj, s, e in zip(memory_objs, starts, ends):
            t = obj.tensor
            checked["chunks"] += 1
            if not torch.equal(t, pattern(t, s, e).view_as(t)):
                checked["bad"] += 1

    MockGPUConnector.batched_from_gpu = from_gpu
    MockGPUConnector.batched_to_gpu = to_gpu

    with open(spec["config_path"], "w") as f:
        f.write(spec["config"])
    cfg = LMCacheEngineConfig.from_file(spec["config_path"])
    md = LMCacheMetadata(model_name=spec.get("model", "test-model"), world_size=1, local_world_size=1, worker_id=0,
                         local_worker_id=0, kv_dtype=torch.float16, kv_shape=(2, 2, 256, 4, 16), use_mla=False,
                         role="worker")
    starter = LMCacheStandaloneStarter(cfg, md, parse_kvcache_shape_spec("(2,2,256,4,16):float16:2"), "cpu")
    engine = starter.start()
    remote = next(b for name, b in engine.storage_manager.storage_backends.items() if "kvtier" in name)
    conn = remote.connection
    conn = getattr(conn, "getWrappedConnector", lambda: conn)()
    tokens = spec["tokens"]
    chunks = len(tokens) // 256
    out: dict = {"mode": spec["mode"]}

    def store():
        engine.store(tokens, kvcaches=starter.kv_caches)
        end = time.monotonic() + 60
        while conn.stats["puts"] + conn.stats["put_failures"] < chunks and time.monotonic() < end:
            time.sleep(0.02)

    if spec["mode"] in ("store", "outage", "pin"):
        store()
        out["stored"] = dict(conn.stats)
        out["namespaces"] = sorted(conn._ns_cache.values())
        out["keys"] = [conn.kvkey(key).decode() for _, _, key in engine.token_database.process_tokens(tokens)]
    if spec["mode"] == "retrieve":
        t = time.monotonic()
        out["lookup"] = engine.lookup(tokens=tokens)
        mask = engine.retrieve(tokens, kvcaches=starter.kv_caches)
        out["retrieved"] = int(mask.sum())
        out["elapsed_s"] = time.monotonic() - t
        out["checked"] = dict(checked)
        out["stats"] = dict(conn.stats)
    if spec["mode"] == "outage":
        with open(spec["ready"], "w") as f:
            f.write("stored")
        end = time.monotonic() + 120
        while not os.path.exists(spec["go"]) and time.monotonic() < end:
            time.sleep(0.02)
        # LMCache's CPU cache is off (local_cpu: false): lookups go to kvtier.
        t = time.monotonic()
        out["lookup"] = engine.lookup(tokens=tokens)
        out["retrieved"] = int(engine.retrieve(tokens, kvcaches=starter.kv_caches).sum())
        engine.store(list(range(10_000, 10_000 + 512)), kvcaches=starter.kv_caches)
        out["elapsed_s"] = time.monotonic() - t
        out["stats"] = dict(conn.stats)
    if spec["mode"] == "pin":
        import asyncio

        from kvtier import Client

        keys = [key for _, _, key in engine.token_database.process_tokens(tokens)]
        run = lambda coro: asyncio.run_coroutine_threadsafe(coro, conn.loop).result(60)  # noqa: E731
        with Client(spec["url"]) as c:
            out["leases_before"] = c.stats().active_leases
            out["found"] = run(conn.batched_async_contains("lookup-1", keys, True))
            out["leases_after_lookup"] = c.stats().active_leases
            objs = run(conn.batched_get_non_blocking("lookup-1", keys))
            out["read"] = len(objs)
            for o in objs:
                o.ref_count_down()
            out["leases_after_get"] = c.stats().active_leases
            # A lookup without pin takes no lease at all.
            run(conn.batched_async_contains("lookup-2", keys, False))
            out["leases_after_unpinned_lookup"] = c.stats().active_leases
        out["stats"] = dict(conn.stats)
    starter.stop()
    json.dump(out, open(out_path, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
