"""kvtier.sglang.KvtierHiCache on CPU: a real kvtier server and host pools
laid out as SGLang's MHA host pool lays them out (page-first and
layer-first), whose ``get_page_buffer_meta`` follows SGLang's own formulas
(sglang/srt/mem_cache/pool_host/mha.py). SGLang itself needs a GPU to run;
this is the backend's whole contract with it."""
from __future__ import annotations

import time

import pytest
import torch

from kvtier import Block, Client
from kvtier.server import Server
from kvtier.sglang import KvtierHiCache


class FakeMHAHostPool:
    """SGLang's MHATokenToKVPoolHost memory, without a device pool behind it."""

    def __init__(self, layout="page_first", size=64, page_size=16, layer_num=3, head_num=2, head_dim=8,
                 dtype=torch.bfloat16, seed=0):
        self.layout, self.size, self.page_size = layout, size, page_size
        self.layer_num, self.head_num, self.head_dim, self.dtype = layer_num, head_num, head_dim, dtype
        dims = (2, layer_num, size, head_num, head_dim) if layout == "layer_first" else (2, size, layer_num, head_num, head_dim)
        g = torch.Generator().manual_seed(seed)
        self.kv_buffer = torch.randn(dims, generator=g).to(dtype)

    def get_page_buffer_meta(self, indices):
        """Verbatim SGLang: (pointers, sizes) of every page's segments."""
        assert len(indices) % self.page_size == 0
        base = self.kv_buffer.data_ptr()
        it = self.dtype.itemsize
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * it
        indices = indices.tolist()
        ptrs = []
        if self.layout == "layer_first":
            for index in range(0, len(indices), self.page_size):
                for layer_id in range(self.layer_num):
                    k_ptr = base + indices[index] * self.head_num * self.head_dim * it \
                        + layer_id * self.size * self.head_num * self.head_dim * it
                    ptrs += [k_ptr, k_ptr + v_offset]
            size = it * self.page_size * self.head_num * self.head_dim
        else:
            for index in range(0, len(indices), self.page_size):
                k_ptr = base + indices[index] * self.layer_num * self.head_num * self.head_dim * it
                ptrs += [k_ptr, k_ptr + v_offset]
            size = self.layer_num * it * self.page_size * self.head_num * self.head_dim
        return ptrs, [size] * len(ptrs)

    def page(self, p):
        """The KV of page ``p`` (a copy), for comparisons."""
        s = slice(p * self.page_size, (p + 1) * self.page_size)
        return self.kv_buffer[:, :, s].clone() if self.layout == "layer_first" else self.kv_buffer[:, s].clone()


def _config(url, **extra):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="test/model",
        extra_config={"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierHiCache",
                      "url": url, **extra},
    )


def _backend(url, pool, **extra):
    b = KvtierHiCache(_config(url, **extra), {})
    b.register_mem_pool_host(pool)
    return b


def _indices(pages, page_size=16):
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_pages_round_trip_through_kvtier_into_another_pool(server, layout):
    src = FakeMHAHostPool(layout, seed=1)
    dst = FakeMHAHostPool(layout, seed=2)
    keys = [f"page{i}_{layout}" for i in range(4)]
    a = _backend(server.grpc, src)
    b = _backend(server.grpc, dst)
    assert a.namespace == b.namespace, "same model and layout, same namespace"
    assert a.batch_exists(keys) == 0
    assert a.batch_set_v1(keys[:3], _indices([0, 1, 2])) == [True] * 3
    assert b.batch_exists(keys) == 3, "Lookup: the leading run of pages"
    # Into pages 3, 0, 1 of the other pool (zero copy: straight into its memory).
    got = b.batch_get_v1(keys[:3], _indices([3, 0, 1]))
    assert got == [True, True, True]
    for s, d in ((0, 3), (1, 0), (2, 1)):
        assert torch.equal(dst.page(d), src.page(s)), (s, d)
    # A partial run: page 3 is missing, so only the two leading pages load.
    assert b.batch_get_v1([keys[0], keys[3], keys[1]], _indices([2, 3, 0])) == [True, False, False]


def test_layouts_and_models_never_share_pages(server):
    pf = _backend(server.grpc, FakeMHAHostPool("page_first"))
    lf = _backend(server.grpc, FakeMHAHostPool("layer_first"))
    other_dtype = _backend(server.grpc, FakeMHAHostPool("page_first", dtype=torch.float16))
    other_model = KvtierHiCache(_config(server.grpc), {})
    cfg = other_model.storage_config
    cfg.model_name = "other/model"
    other_model.register_mem_pool_host(FakeMHAHostPool("page_first"))
    assert len({pf.namespace, lf.namespace, other_dtype.namespace, other_model.namespace}) == 4
    assert pf.batch_set_v1(["shared"], _indices([0])) == [True]
    for b in (lf, other_dtype, other_model):
        assert b.batch_exists(["shared"]) == 0


def test_a_page_of_the_wrong_size_is_a_miss_never_loaded(server):
    pool = FakeMHAHostPool()
    b = _backend(server.grpc, pool)
    before = pool.page(0)
    with Client(server.grpc) as c:
        c.write(b.namespace, [Block(key=b"bad", payload=b"\x07" * 100)])
    assert b.batch_exists(["bad"]) == 1
    # Read straight into the page asked for (SGLang gives a get pages of its
    # own and takes back those not reported loaded): never reported loaded,
    # and no other page touched.
    assert b.batch_get_v1(["bad"], _indices([1])) == [False]
    assert torch.equal(pool.page(0), before), "no other pool page is touched"
    assert b.get_stats()["bad_size"] == 1 and b.get_stats()["loaded_pages"] == 0
    # A page longer than this layout's pages fails the read: a miss too.
    with Client(server.grpc) as c:
        c.write(b.namespace, [Block(key=b"long", payload=b"\x07" * (b.page_bytes + 1))])
    assert b.batch_get_v1(["long"], _indices([1])) == [False]
    assert torch.equal(pool.page(0), before)


def test_kvtier_down_is_a_miss_without_a_hang(kvtier_bin):
    s = Server.start(binary=kvtier_bin)
    pool = FakeMHAHostPool()
    b = _backend(s.grpc, pool, timeout_ms=2000)
    assert b.batch_set_v1(["p0"], _indices([0])) == [True]
    s.stop()
    t = time.monotonic()
    assert b.batch_exists(["p0"]) == 0
    assert b.batch_get_v1(["p0"], _indices([1])) == [False]
    assert b.batch_set_v1(["p1"], _indices([1])) == [False]
    assert time.monotonic() - t < 10, "each call gives up within its timeout"
    assert b.get_stats()["errors"] == 3


def test_config_errors_are_clear(server):
    with pytest.raises(ValueError, match="needs \"url\""):
        KvtierHiCache(_config(""), {})
    with pytest.raises(ValueError, match=r"unknown extra config \['bogus'\]"):
        KvtierHiCache(_config(server.grpc, bogus=1), {})


def _rank_backend(url, pool, **ranks):
    b = KvtierHiCache(_config(url), {})
    for k, v in ranks.items():
        setattr(b.storage_config, k, v)
    b.register_mem_pool_host(pool)
    return b


def test_mla_ranks_read_the_pages_rank_zero_stores(server):
    """SGLang backs MLA pages up from the storage writer only (rank 0, or one
    rank per DCP shard) and takes the smallest hit count over the TP group:
    every MLA rank must look in the writer's namespace, or TP > 1 never hits."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    pool = FakeMHAHostPool()
    mla = [_rank_backend(server.grpc, pool, is_mla_model=True, tp_rank=r, tp_size=4) for r in range(4)]
    writers = [b for b in mla if b.storage_config.is_storage_writer]
    assert [b.storage_config.tp_rank for b in writers] == [0], "SGLang: MLA backs up from rank 0 only"
    assert len({b.namespace for b in mla}) == 1
    assert writers[0].batch_set_v1(["mla0", "mla1"], _indices([0, 1])) == [True, True]
    assert [b.batch_exists(["mla0", "mla1"]) for b in mla] == [2, 2, 2, 2]
    assert mla[3].batch_get_v1(["mla0", "mla1"], _indices([2, 3])) == [True, True]
    # Without MLA each rank holds its own heads: namespaces stay per rank.
    mha = [_rank_backend(server.grpc, pool, tp_rank=r, tp_size=4) for r in range(4)]
    assert len({b.namespace for b in mha} | {mla[0].namespace}) == 5
    # Decode context parallel: one writer per DCP shard, shards kept apart.
    dcp = []
    for r in range(4):
        cfg = HiCacheStorageConfig(
            tp_rank=r, tp_size=4, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=True,
            enable_storage_metrics=False, is_page_first_layout=True, model_name="test/model",
            extra_config=_config(server.grpc).extra_config, dcp_size=2, dcp_rank=r % 2, logical_page_size=16)
        b = KvtierHiCache(cfg, {})
        b.register_mem_pool_host(pool)
        dcp.append(b)
    assert [b.storage_config.is_storage_writer for b in dcp] == [True, True, False, False]
    assert dcp[0].namespace == dcp[2].namespace != dcp[1].namespace == dcp[3].namespace


def test_data_plane_flag_parses_strings_and_refuses_others(server):
    def uses_data_plane(v):
        b = KvtierHiCache(_config(server.grpc, data_plane=v), {})
        try:
            return b.client._data_plane
        finally:
            b.close()

    for v in (True, 1, "true", "True", "1", "yes", " YES "):
        assert uses_data_plane(v) is True, v
    for v in (False, 0, "false", "False", "0", "no", "NO"):
        assert uses_data_plane(v) is False, v
    for v in ("maybe", "", 2, None, 1.0):
        with pytest.raises(ValueError, match="data_plane must be true or false"):
            KvtierHiCache(_config(server.grpc, data_plane=v), {})


def test_loaded_by_sglangs_own_factory(server):
    """SGLang's StorageBackendFactory loads the backend from the documented extra config."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    backend = StorageBackendFactory.create_backend("dynamic", _config(server.grpc), FakeMHAHostPool())
    assert type(backend).__name__ == "KvtierHiCache"


@pytest.fixture(scope="module")
def local_server(kvtier_bin, tmp_path_factory):
    """A server with a same-host socket; ``.local`` is its path."""
    sock = tmp_path_factory.mktemp("sglang") / "kvtier.sock"
    s = Server.start(binary=kvtier_bin, args=["--local-listen", str(sock), "--memory-capacity", "512MiB"])
    s.local = str(sock)  # type: ignore[attr-defined]
    yield s
    assert s.stop() == 0


@pytest.mark.parametrize("path", ["same-host", "tcp"])
def test_batch_get_reads_pages_straight_into_the_pool(local_server, path, monkeypatch):
    """4 MiB pages (16 layers, 8 heads of 128, 64 tokens, bf16): ``batch_get_v1``
    reads them straight into the pool's page segments (by the server itself
    on the same-host socket), never through the native read that returns new
    ``bytes`` and copies them again (notes/060)."""
    import kvtier.dataplane

    big = {"size": 256, "page_size": 64, "layer_num": 16, "head_num": 8, "head_dim": 128}
    src = FakeMHAHostPool("page_first", seed=3, **big)
    dst = FakeMHAHostPool("page_first", seed=4, **big)
    a = _backend(local_server.grpc, src)
    b = _backend(f"unix://{local_server.local}", dst)
    if path == "tcp":  # the backend's client as it is made, but kept off the same-host socket
        b.client.close()
        b.client = Client(local_server.grpc, timeout=5, retries=1, retry_shed=False, same_host=False)
    assert b.page_bytes == 4 << 20
    keys = [f"big{i}_{path}" for i in range(3)]
    assert a.batch_set_v1(keys, _indices([0, 1, 2], 64)) == [True] * 3
    pool = b.client.data_plane()
    assert pool is not None and pool.copies_by_memory == (path == "same-host")

    def spy(*args, **kwargs):
        raise AssertionError("read through new bytes")

    monkeypatch.setattr(kvtier.dataplane.DataPlane, "read", spy)
    monkeypatch.setattr(type(b.client), "read", spy)
    assert b.batch_get_v1(keys, _indices([3, 1, 0], 64)) == [True] * 3
    for s, d in ((0, 3), (1, 1), (2, 0)):
        assert torch.equal(dst.page(d), src.page(s)), (s, d)
    assert b.get_stats()["errors"] == 0 and b.get_stats()["loaded_pages"] == 3
