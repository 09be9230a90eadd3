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
    assert b.batch_get_v1(["bad"], _indices([0])) == [False]
    assert torch.equal(pool.page(0), before), "the pool page is untouched"
    assert b.get_stats()["bad_size"] == 1


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


def test_loaded_by_sglangs_own_factory(server):
    """SGLang's StorageBackendFactory loads the backend from the documented extra config."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    backend = StorageBackendFactory.create_backend("dynamic", _config(server.grpc), FakeMHAHostPool())
    assert type(backend).__name__ == "KvtierHiCache"
