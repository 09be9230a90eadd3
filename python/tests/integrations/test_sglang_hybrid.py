"""kvtier.sglang.KvtierHiCache's v2 pool-transfer interface (SGLang's hybrid
models) on CPU, against a real kvtier server: SGLang's own Mamba host pool and
DeepSeek V4's logical anchor and paged pools, built on CPU, and for the KV and
sliding-window pools the MHA host pool stand-in of test_sglang.py (SGLang's
MHA host pool module imports its device pools, which need torchvision)."""
from __future__ import annotations

import functools
import importlib
import os
import sys
import time
import types
import uuid

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from test_sglang import FakeMHAHostPool, _config, _indices

import kvtier.sglang_pools
from kvtier import Block, Client
from kvtier.server import Server
from kvtier.sglang import KvtierHiCache

ALL, TRAILING, GROUPS = PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES, PoolHitPolicy.BLOCK_GROUPS


@functools.cache
def _sglang_pools():
    """SGLang's host pool modules that build on CPU. The package's __init__
    imports the device pools, whose imports need torchvision (not in this
    venv, and not used by host pools): the modules are loaded with that
    __init__ left out, and SGLang's own package restored after."""
    import sglang.srt.mem_cache as mem_cache

    name = "sglang.srt.mem_cache.pool_host"
    saved = sys.modules.get(name)
    pkg = types.ModuleType(name)
    pkg.__path__ = [os.path.join(mem_cache.__path__[0], "pool_host")]
    sys.modules[name] = pkg
    try:
        pkg.HostKVCache = importlib.import_module(f"{name}.base").HostKVCache  # type: ignore[attr-defined]
        mamba = importlib.import_module(f"{name}.mamba")
        paged = importlib.import_module("sglang.srt.mem_cache.memory_pool_host")
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved
    return types.SimpleNamespace(MambaPoolHost=mamba.MambaPoolHost, LogicalHostPool=paged.LogicalHostPool,
                                 DeepSeekV4PagedHostPool=paged.DeepSeekV4PagedHostPool)


def _mamba(seed: int, side_state: bool = False):
    """SGLang's MambaPoolHost (page_first, 17 state slots), states random. With a
    side state its pages are not plain segments: the backend moves flat pages."""
    from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo

    side = (torch.zeros(8, 5, dtype=torch.int32),) if side_state else ()
    info = MambaStateBufferInfo(temporal=torch.zeros(2, 8, 4, 8),
                                conv=(torch.zeros(2, 8, 3, 16, dtype=torch.bfloat16),), extra_checkpoint_buffers=side)
    pool = _sglang_pools().MambaPoolHost(info, 2.0, 0, device_capacity=8, pin_memory=False, device="cpu",
                                         layout="page_first")
    g = torch.Generator().manual_seed(seed)
    for buf in (pool.temporal_buffer, *pool.conv_buffer, *pool.slot_state_buffers):
        buf.copy_(torch.randint(0, 100, buf.shape, generator=g).to(buf.dtype))
    return pool


def _paged(name: str, seed: int):
    """DeepSeek V4's paged host pool: 8 pages of 16 tokens, 2 layers of 64 bytes."""
    pool = _sglang_pools().DeepSeekV4PagedHostPool(
        pool_name=name, device_buffers=[torch.zeros(8, 64, dtype=torch.uint8)] * 2, item_bytes=64, num_host_pages=8,
        slot_page_size=16, layout="page_first", device="cpu", pin_memory=False)
    pool.kv_buffer.copy_(torch.randint(0, 256, pool.kv_buffer.shape, generator=torch.Generator().manual_seed(seed)))
    return pool


def _kv(seed: int):
    return FakeMHAHostPool("page_first", size=256, seed=seed)


def _swa(seed: int):
    """A sliding-window pool: SGLang's MHA host pool too, with its own geometry."""
    return FakeMHAHostPool("page_first", size=256, layer_num=2, head_num=1, seed=seed)


def _backend(url: str, pools: dict, extra: dict | None = None, **cfg) -> KvtierHiCache:
    """As SGLang's hybrid controller attaches a backend: the anchor, then every
    pool, then the end of it. ``cfg``: storage config fields (ranks)."""
    b = KvtierHiCache(_config(url, **(extra or {})), {})
    for k, v in cfg.items():
        setattr(b.storage_config, k, v)
    b.register_mem_pool_host(pools[PoolName.KV])
    for name, pool in pools.items():
        b.register_mem_host_pool_v2(pool, name)
    b.on_host_pools_registered()
    return b


def _keys(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"{tag}{i:04d}" for i in range(n)]


def _t(name, keys, idx=None, policy=ALL) -> PoolTransfer:
    return PoolTransfer(name=name, keys=list(keys), host_indices=idx, hit_policy=policy)


def _page(pool, index: int) -> torch.Tensor:
    return pool.page(index) if isinstance(pool, FakeMHAHostPool) else pool.get_data_page(index).clone()


@pytest.mark.parametrize("side_state", [False, True], ids=["segments", "flat-pages"])
def test_hybrid_pools_round_trip_into_a_fresh_backend(server, side_state):
    src = {PoolName.KV: _kv(1), PoolName.SWA: _swa(2), PoolName.MAMBA: _mamba(3, side_state)}
    dst = {PoolName.KV: _kv(4), PoolName.SWA: _swa(5), PoolName.MAMBA: _mamba(6, side_state)}
    a = _backend(server.grpc, src)
    assert a.pools["mamba"].mode == ("flat" if side_state else "segments")
    keys = _keys(4)
    # As SGLang backs up a node of 4 pages: KV through v1, then the window of
    # 2 SWA pages and the Mamba state at the node's end.
    assert a.batch_set_v1(keys, _indices([0, 1, 2, 3])) == [True] * 4
    done = a.batch_set_v2([_t(PoolName.SWA, keys[2:], _indices([2, 3]), TRAILING),
                           _t(PoolName.MAMBA, keys[3:], torch.tensor([5]), TRAILING)],
                          HiCacheStorageExtraInfo(prefix_keys=keys[:2]))
    assert done == {PoolName.SWA: [True, True], PoolName.MAMBA: [True]}

    b = _backend(server.grpc, dst)  # another process: nothing but kvtier in common
    assert len({b.namespace, *(p.namespace for p in b.pools.values())}) == 3
    hit = b.batch_exists_v2(keys, [_t(PoolName.SWA, keys[2:], policy=TRAILING),
                                   _t(PoolName.MAMBA, keys[3:], policy=TRAILING)])
    assert hit.kv_hit_pages == 4 and hit.restorable_prefix_pages == [4]
    assert hit.extra_pool_hit_pages == {PoolName.KV: 4, PoolName.SWA: 4, PoolName.MAMBA: 4}
    assert b.batch_get_v1(keys, _indices([4, 5, 6, 7])) == [True] * 4
    got = b.batch_get_v2([_t(PoolName.SWA, keys[2:], _indices([0, 1]), TRAILING),
                          _t(PoolName.MAMBA, keys[3:], torch.tensor([2]), TRAILING)])
    assert got == {PoolName.SWA: [True, True], PoolName.MAMBA: [True]}
    for name, pairs in ((PoolName.KV, [(0, 4), (1, 5), (2, 6), (3, 7)]), (PoolName.SWA, [(2, 0), (3, 1)]),
                        (PoolName.MAMBA, [(5, 2)])):
        for s, d in pairs:
            assert torch.equal(_page(dst[name], d), _page(src[name], s)), (name, s, d)
    assert not torch.equal(_page(dst[PoolName.MAMBA], 3), _page(src[PoolName.MAMBA], 5)), "other slots untouched"
    assert b.get_stats()["errors"] == 0 and b.get_stats()["pool_loaded_pages"] == 3


def test_deepseek_v4_logical_anchor_and_paged_pools(server):
    """DeepSeek V4: a logical KV anchor (indices, no bytes) and paged side pools."""
    pools = _sglang_pools()
    c4, swa = PoolName.DEEPSEEK_V4_C4, PoolName.SWA
    src = {PoolName.KV: pools.LogicalHostPool(128, 16), c4: _paged("c4", 1), swa: _paged("swa", 2)}
    dst = {PoolName.KV: pools.LogicalHostPool(128, 16), c4: _paged("c4", 3), swa: _paged("swa", 4)}
    a, b = _backend(server.grpc, src), _backend(server.grpc, dst)
    keys = _keys(5)
    assert a.batch_set_v1(keys[:4], _indices([0, 1, 2, 3])) == [True] * 4, "nothing to store, nothing failed"
    assert a.batch_exists(keys) == 0, "no KV bytes stored: v1 alone never hits"
    assert a.batch_set_v2([_t(c4, keys[:4], _indices([0, 1, 2, 3])),
                           _t(swa, keys[2:4], _indices([4, 5]), TRAILING)]) == {c4: [True] * 4, swa: [True] * 2}
    # The KV "hit" is every page; the C4 pool needs them all, the SWA window the last 2.
    hit = b.batch_exists_v2(keys, [_t(c4, keys), _t(swa, keys[3:], policy=TRAILING)])
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (4, [4])
    assert hit.extra_pool_hit_pages == {PoolName.KV: 5, c4: 4, swa: 4}
    assert b.batch_get_v1(keys[:4], _indices([4, 5, 6, 7])) == [True] * 4
    assert b.batch_get_v2([_t(PoolName.KV, keys[:4], _indices([4, 5, 6, 7]))]) == {PoolName.KV: [True] * 4}
    got = b.batch_get_v2([_t(c4, keys[:4], _indices([7, 6, 5, 4])), _t(swa, keys[2:4], _indices([0, 1]), TRAILING)])
    assert got == {c4: [True] * 4, swa: [True] * 2}
    for name, pairs in ((c4, [(0, 7), (1, 6), (2, 5), (3, 4)]), (swa, [(4, 0), (5, 1)])):
        for s, d in pairs:
            assert torch.equal(_page(dst[name], d * 16), _page(src[name], s * 16)), (name, s, d)


def _stored(server, pools: dict, policy_of: dict, n: int, pages: dict | None = None):
    """A backend with ``n`` KV pages stored and, per pool, the pages in ``pages``
    (every page by default), each pool stored as SGLang stores it with its policy."""
    b = _backend(server.grpc, pools)
    keys = _keys(n)
    assert b.batch_set_v1(keys, _indices(range(n))) == [True] * n
    for name, policy in policy_of.items():
        for p in (pages or {}).get(name, range(n)):
            idx = _indices([p]) if pools[name].page_size == 16 else torch.tensor([p])
            assert b.batch_set_v2([_t(name, [keys[p]], idx, policy)],
                                  HiCacheStorageExtraInfo(prefix_keys=keys[:p])) == {name: [True]}
    return b, keys


def test_trailing_window_shrinks_the_hit_only_when_a_page_in_it_is_missing(server):
    b, keys = _stored(server, {PoolName.KV: _kv(0), PoolName.SWA: _swa(1)}, {PoolName.SWA: TRAILING}, 6)
    window = [_t(PoolName.SWA, keys[4:], policy=TRAILING)]  # 2 pages
    hit = b.batch_exists_v2(keys, window)
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (6, [1, 2, 3, 4, 5, 6])
    ns = b.pools["swa"].namespace
    with Client(server.grpc) as c:
        assert c.delete(ns, [keys[1].encode()]).deleted == 1
        hit = b.batch_exists_v2(keys, window)
        assert hit.kv_hit_pages == 6, "a page before the window is not needed"
        assert 6 in hit.restorable_prefix_pages and not {2, 3} & set(hit.restorable_prefix_pages)
        assert c.delete(ns, [keys[5].encode()]).deleted == 1, "unlinked: page 1's deletion left it"
        hit = b.batch_exists_v2(keys, window)
    assert hit.kv_hit_pages == 5 and hit.extra_pool_hit_pages[PoolName.SWA] == 5
    assert 5 in hit.restorable_prefix_pages and 6 not in hit.restorable_prefix_pages
    with Client(server.grpc) as c:  # the first page of the window now: only page 0 is left to restore
        assert c.delete(ns, [keys[3].encode()]).deleted == 1
    hit = b.batch_exists_v2(keys, window)
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (1, [1])
    assert b.batch_exists(keys) == 6, "v1: the KV pages as they were"


def test_mamba_hit_moves_back_to_the_last_state_present(server, monkeypatch):
    pools = {PoolName.KV: _kv(0), PoolName.MAMBA: _mamba(1)}
    b, keys = _stored(server, pools, {PoolName.MAMBA: TRAILING}, 6, {PoolName.MAMBA: [2, 5]})
    state = [_t(PoolName.MAMBA, keys[5:], policy=TRAILING)]
    assert b.batch_exists_v2(keys, state).kv_hit_pages == 6
    with Client(server.grpc) as c:
        c.delete(b.pools["mamba"].namespace, [keys[5].encode()])
    hit = b.batch_exists_v2(keys, state)
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (3, [3]), "the state after page 2"
    # Out of probes before the state is found: a shorter hit (none), never a wrong one.
    monkeypatch.setattr(kvtier.sglang_pools, "TRAILING_PROBES", 2)
    hit = b.batch_exists_v2(keys, state)
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (0, [])
    assert hit.extra_pool_hit_pages == {PoolName.KV: 6}, "no verdict claimed for the state"


@pytest.mark.parametrize("below", [kvtier.sglang_pools.PROBE_BELOW, 0], ids=["default", "window-only-probes"])
def test_two_trailing_pools_settle_on_a_length_both_restore(server, monkeypatch, below):
    """Every SWA page is stored, the Mamba state only after page 4: 5 pages,
    whether or not a probe reads past the window (pages not asked are unknown,
    never missing)."""
    monkeypatch.setattr(kvtier.sglang_pools, "PROBE_BELOW", below)
    pools = {PoolName.KV: _kv(0), PoolName.SWA: _swa(1), PoolName.MAMBA: _mamba(1)}
    b, keys = _stored(server, pools, {PoolName.SWA: TRAILING, PoolName.MAMBA: TRAILING}, 6, {PoolName.MAMBA: [4]})
    asked: dict[str, int] = {}
    lookup = b.client.lookup

    def spy(namespace, keys=None, **kw):
        asked[namespace] = max(asked.get(namespace, 0), len(keys))
        return lookup(namespace, keys=keys, **kw)

    monkeypatch.setattr(b.client, "lookup", spy)
    hit = b.batch_exists_v2(keys, [_t(PoolName.SWA, keys[4:], policy=TRAILING),
                                   _t(PoolName.MAMBA, keys[5:], policy=TRAILING)])
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (5, [5])
    assert hit.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.SWA: 6, PoolName.MAMBA: 5}
    assert asked[b.pools["swa"].namespace] == min(6, 2 + below), "a probe asks for its window and what is below"
    assert asked[b.pools["mamba"].namespace] == min(6, 1 + below)


def test_all_pages_pool_needs_every_page_and_block_groups_never_gate(server):
    pools = {PoolName.KV: _kv(0), PoolName.INDEXER: _swa(1), PoolName.DEEPSEEK_V4_C4: _swa(2)}
    b, keys = _stored(server, pools, {PoolName.INDEXER: ALL}, 6)
    groups = _t(PoolName.DEEPSEEK_V4_C4, keys, policy=GROUPS)  # nothing stored for it
    hit = b.batch_exists_v2(keys, [_t(PoolName.INDEXER, keys), groups])
    assert (hit.kv_hit_pages, hit.extra_pool_hit_pages) == (6, {PoolName.KV: 6, PoolName.INDEXER: 6})
    with Client(server.grpc) as c:  # chained as the KV pages: the pages after it go too
        assert c.delete(b.pools["indexer"].namespace, [keys[3].encode()]).deleted == 3
    hit = b.batch_exists_v2(keys, [_t(PoolName.INDEXER, keys), groups])
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (3, [1, 2, 3])
    assert hit.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.INDEXER: 3}


def test_pools_never_share_a_key(server):
    pools = {PoolName.KV: _kv(0), PoolName.SWA: _swa(1), PoolName.INDEXER: _swa(1),
             PoolName.MAMBA: _mamba(1)}
    b = _backend(server.grpc, pools)
    spaces = {"kv": b.namespace, **{n: p.namespace for n, p in b.pools.items()}}
    assert len(set(spaces.values())) == 4, "the same layout under two names: two namespaces"
    key = _keys(1)
    assert b.batch_set_v2([_t(PoolName.SWA, key, _indices([0]), TRAILING)]) == {PoolName.SWA: [True]}
    with Client(server.grpc) as c:
        found = {n: c.lookup(ns, keys=[key[0].encode()]).found for n, ns in spaces.items()}
    assert found == {"kv": 0, "swa": 1, "indexer": 0, "mamba": 0}
    assert b.batch_exists(key) == 0
    got = b.batch_get_v2([_t(PoolName.INDEXER, key, _indices([1])), _t(PoolName.MAMBA, key, torch.tensor([0]))])
    assert got == {PoolName.INDEXER: [False], PoolName.MAMBA: [False]}
    # MLA: the KV and replicated pools in rank 0's namespace; Mamba state stays per rank.
    ranks = [_backend(server.grpc, pools, is_mla_model=True, tp_rank=r, tp_size=2) for r in (0, 1)]
    assert ranks[0].namespace == ranks[1].namespace
    assert ranks[0].pools["swa"].namespace == ranks[1].pools["swa"].namespace
    assert ranks[0].pools["mamba"].namespace != ranks[1].pools["mamba"].namespace


def test_v2_failures_are_misses(server, kvtier_bin):
    pools = {PoolName.KV: _kv(0), PoolName.SWA: _swa(1)}
    b = _backend(server.grpc, pools)
    keys = _keys(2)
    swa = b.pools["swa"]
    before = pools[PoolName.SWA].page(0)
    with Client(server.grpc) as c:  # one byte short: read into the front of page 1, never reported loaded
        c.write(swa.namespace, [Block(key=keys[0].encode(), payload=b"\x07" * (swa.page_bytes - 1))])
    assert b.batch_get_v2([_t(PoolName.SWA, keys[:1], _indices([1]))]) == {PoolName.SWA: [False]}
    assert torch.equal(pools[PoolName.SWA].page(0), before), "no other page touched"
    assert b.get_stats()["bad_size"] == 1 and b.get_stats()["pool_loaded_pages"] == 0
    assert b.batch_set_v2([_t(PoolName.SWA, keys, _indices([0]))]) == {PoolName.SWA: [False, False]}, "1 page of indices"
    assert b.batch_get_v2([_t(PoolName.DRAFT, keys, _indices([0, 1]))]) == {PoolName.DRAFT: [False, False]}
    assert b.batch_set_v1(keys, _indices([0, 1])) == [True, True]
    hit = b.batch_exists_v2(keys, [])
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (2, [1, 2])
    hit = b.batch_exists_v2(keys, [_t(PoolName.DRAFT, keys)])
    assert hit.kv_hit_pages == 0, "a pool that was never registered has nothing"
    assert b.get_stats()["errors"] == 2
    # A flat page of the wrong size is never stored (a Mamba pool with side states).
    mamba = _mamba(1, side_state=True)
    m = _backend(server.grpc, {PoolName.KV: _kv(0), PoolName.MAMBA: mamba})
    mamba.get_data_page = lambda index, flat=True: torch.zeros(3, dtype=torch.uint8)
    assert m.batch_set_v2([_t(PoolName.MAMBA, keys[:1], torch.tensor([0]), TRAILING)]) == {PoolName.MAMBA: [False]}
    with Client(server.grpc) as c:
        assert c.lookup(m.pools["mamba"].namespace, keys=[keys[0].encode()]).found == 0

    s = Server.start(binary=kvtier_bin)
    down = _backend(s.grpc, pools, {"timeout_ms": 2000})
    s.stop()
    t = time.monotonic()
    assert down.batch_exists_v2(keys, [_t(PoolName.SWA, keys[1:], policy=TRAILING)]).kv_hit_pages == 0
    assert down.batch_set_v2([_t(PoolName.SWA, keys, _indices([0, 1]))]) == {PoolName.SWA: [False, False]}
    assert down.batch_get_v2([_t(PoolName.SWA, keys, _indices([0, 1]))]) == {PoolName.SWA: [False, False]}
    assert time.monotonic() - t < 10, "each call gives up within its timeout"
    assert down.get_stats()["errors"] == 3
