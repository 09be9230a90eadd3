"""Unit tests of the vLLM connector's parts: config, namespace identity, chain
keys, payload layout, circuit breaker, the scheduler's load/save planning
(with stand-ins for vLLM's request objects) and the worker against a real
kvtier server. The engine-level behaviour is in test_engine.py."""
from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest
import torch

from kvtier import keys as kvkeys
from kvtier.vllm.common import Breaker, LoadSpec, SaveSpec, StatsLog, chain_keys
from kvtier.vllm.config import ConnectorConfig
from kvtier.vllm.identity import EngineIdentity, unsupported_reason, weights_fingerprint
from kvtier.vllm.layout import LayoutError, PayloadLayout

BS = 128


# -- config -----------------------------------------------------------------

def test_config_defaults_and_errors():
    c = ConnectorConfig.from_extra({"url": "127.0.0.1:1"})
    assert c.load_mode == "sync" and c.lookup_timeout_ms == 500 and c.load_failure_policy == "recompute"
    with pytest.raises(ValueError, match="needs \"url\""):
        ConnectorConfig.from_extra({})
    with pytest.raises(ValueError, match=r"unknown .*\['lookup_timeout'\]"):
        ConnectorConfig.from_extra({"url": "x:1", "lookup_timeout": 5})
    with pytest.raises(ValueError, match="lookup_timeout_ms must be a non-negative integer"):
        ConnectorConfig.from_extra({"url": "x:1", "lookup_timeout_ms": "5"})
    with pytest.raises(ValueError, match="load_mode"):
        ConnectorConfig.from_extra({"url": "x:1", "load_mode": "eager"})
    with pytest.raises(ValueError, match="namespace_prefix"):
        ConnectorConfig.from_extra({"url": "x:1", "namespace_prefix": "bad prefix!"})
    with pytest.raises(ValueError, match="data_plane must be true or false"):
        ConnectorConfig.from_extra({"url": "x:1", "data_plane": 1})
    with pytest.raises(ValueError, match="lookup_timeout_ms must be > 0"):
        ConnectorConfig.from_extra({"url": "x:1", "lookup_timeout_ms": 0})


# -- identity ---------------------------------------------------------------

def _configs(tmp_path, model="m", dtype=torch.float32, block_size=BS, cache_dtype="auto", tp=1, heads=2,
             window=None, groups=1):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=64, dtype=dtype,
                             sliding_window=window)
    group = SimpleNamespace(kv_cache_spec=spec, layer_names=[f"model.layers.{i}.self_attn.attn" for i in range(4)])
    kv = SimpleNamespace(kv_cache_groups=[group] * groups)
    hf = SimpleNamespace(to_dict=lambda: {"hidden_size": 256, "_name_or_path": "ignored"})
    vc = SimpleNamespace(
        model_config=SimpleNamespace(model=str(tmp_path / model), revision=None, dtype=dtype, quantization=None,
                                     hf_config=hf),
        cache_config=SimpleNamespace(block_size=block_size, cache_dtype=cache_dtype),
        device_config=SimpleNamespace(device_type="cpu"),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1),
    )
    return vc, kv


def _ns(tmp_path, rank=0, model_id="", prefix="", **kw):
    vc, kv = _configs(tmp_path, **kw)
    return EngineIdentity(vc, kv, model_id, prefix).namespace(0, rank)


def test_namespace_separates_everything_that_makes_kv_incompatible(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x00" * 4096)
    base = _ns(tmp_path)
    assert base == _ns(tmp_path), "deterministic"
    assert base.startswith("vllm/m/") and len(base) <= 128
    assert all(ch.isalnum() or ch in "._:/-" for ch in base)
    different = {
        "dtype": _ns(tmp_path, dtype=torch.bfloat16),
        "block size": _ns(tmp_path, block_size=64),
        "cache dtype": _ns(tmp_path, cache_dtype="fp8"),
        "kv heads": _ns(tmp_path, heads=4),
        "tp size": _ns(tmp_path, tp=2),
        "tp rank": _ns(tmp_path, tp=2, rank=1),
        "model path": _ns(tmp_path, model="other"),
        "model id": _ns(tmp_path, model_id="org/model@rev1"),
    }
    for what, ns in different.items():
        assert ns != base, f"{what} must change the namespace"
    assert _ns(tmp_path, tp=2) != _ns(tmp_path, tp=2, rank=1)
    # Same path, new weights (a model re-created in place): a new namespace.
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x01" * 4096)
    assert _ns(tmp_path) != base
    assert _ns(tmp_path, prefix="acme/").startswith("acme/vllm/m/")


def test_pipeline_stages_get_the_same_namespace_in_the_scheduler_and_their_worker(tmp_path, monkeypatch):
    """vLLM builds one KV-cache config per worker (each PP stage's lists only
    its layers) and gives the scheduler a copy of worker 0's
    (generate_scheduler_kv_cache_config): the scheduler's namespace of every
    stage must still be the one that stage's worker uses."""
    from vllm.distributed.utils import get_pp_indices
    from vllm.v1.core.kv_cache_utils import _project_kv_cache_groups_to_worker, generate_scheduler_kv_cache_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=64, dtype=torch.float32)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(6)]

    def engine(pp, tp=2):
        vc, _ = _configs(tmp_path, tp=tp)
        vc.parallel_config.pipeline_parallel_size = pp
        whole = [KVCacheGroupSpec(names, spec)]
        stages = [names[slice(*get_pp_indices(len(names), r, pp))] for r in range(pp)]
        workers = [KVCacheConfig(num_blocks=8, kv_cache_tensors=[],
                                 kv_cache_groups=_project_kv_cache_groups_to_worker(whole, {n: spec for n in stage}))
                   for stage in stages]
        assert [w.kv_cache_groups[0].layer_names for w in workers] == stages
        sched = EngineIdentity(vc, generate_scheduler_kv_cache_config(workers)).namespaces()
        ranks = [EngineIdentity(vc, workers[r]).namespace(r, t) for r in range(pp) for t in range(tp)]
        return sched, ranks

    for pp in (1, 2, 3):
        sched, ranks = engine(pp)
        assert sched == ranks and len(set(ranks)) == 2 * pp, pp
    # Without PP the facts, so the namespaces (and the blocks stored under them), are as before.
    vc, kv = _configs(tmp_path)
    assert EngineIdentity(vc, kv).facts["layers"] == kv.kv_cache_groups[0].layer_names
    assert "pp_layer_partition" not in EngineIdentity(vc, kv).facts
    # Another split of the layers between stages is another namespace.
    even = engine(2)[0]
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "2,4")
    sched, ranks = engine(2)
    assert sched == ranks and not set(sched) & set(even)


def test_weights_fingerprint_samples_head_and_tail(tmp_path):
    d = tmp_path / "w"
    d.mkdir()
    f = d / "model.safetensors"
    f.write_bytes(b"a" * (3 << 20))
    a = weights_fingerprint(d)
    f.write_bytes(b"a" * ((3 << 20) - 1) + b"b")  # last byte differs
    assert weights_fingerprint(d) != a
    assert weights_fingerprint(tmp_path / "missing") == ""


def test_unsupported_kv_caches_are_named(tmp_path):
    assert unsupported_reason(_configs(tmp_path)[1]) == ""
    assert "sliding-window" in unsupported_reason(_configs(tmp_path, window=64)[1])
    assert "2 KV-cache groups" in unsupported_reason(_configs(tmp_path, groups=2)[1])


# -- keys -------------------------------------------------------------------

def test_chain_keys_match_the_kvtier_scheme_and_salt_separates():
    toks = list(range(1000))
    assert chain_keys(toks, BS) == kvkeys.chain(toks, BS)
    salted = chain_keys(toks, BS, salt="tenant-a")
    assert len(salted) == 7 and not set(salted) & set(chain_keys(toks, BS))
    assert salted != chain_keys(toks, BS, salt="tenant-b")
    full = chain_keys(toks, BS, salt="s")
    assert full[:3] + chain_keys(toks, BS, salt="s", start=3, prev=full[2]) == full


def test_a_deployment_key_salt_is_the_kvtier_salted_chain():
    toks = list(range(1000))
    secret = b"acme-secret"
    # No cache_salt: exactly the SDK's chain salted with secret + NUL.
    mine = chain_keys(toks, BS, key_salt=secret)
    assert mine == kvkeys.chain(toks, BS, salt=secret + b"\0")
    assert not set(mine) & set(chain_keys(toks, BS))
    assert not set(mine) & set(chain_keys(toks, BS, key_salt=b"other"))
    # With a cache_salt both count, and continuing a chain keeps the seed.
    both = chain_keys(toks, BS, salt="r", key_salt=secret)
    assert both == kvkeys.chain(toks, BS, salt=secret + b"\0r")
    assert both[:2] + chain_keys(toks, BS, salt="r", start=2, prev=both[1], key_salt=secret) == both


# -- layout -----------------------------------------------------------------

def _caches(layers=3, blocks=6, heads=2, n=BS, c=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"l{i}": torch.randn(blocks, heads, n, c, generator=g).to(dtype) for i in range(layers)}


@pytest.mark.parametrize("batched", [False, True], ids=["per-tile", "batched"])
def test_payload_round_trip_and_size(batched):
    src = _caches()
    lay = PayloadLayout(src, list(src), BS, batched=batched)
    assert lay.nbytes == 3 * 2 * BS * 16 * 4
    data = lay.gather([4, 1])
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    out = PayloadLayout(dst, list(dst), BS, batched=batched)
    out.scatter(0, bytes(data[0].numpy()))
    out.scatter(3, memoryview(data[1].numpy()))
    for k in src:
        assert torch.equal(dst[k][0], src[k][4]) and torch.equal(dst[k][3], src[k][1])
        assert not dst[k][1].any()
    with pytest.raises(LayoutError, match="expected"):
        out.scatter(0, b"x" * 10)


@pytest.mark.parametrize("batched", [False, True], ids=["per-tile", "batched"])
def test_payload_is_the_same_whatever_the_kernel_block_size(batched):
    """A cache split into 32-token kernel blocks gives the payload of the same
    tokens held in one 128-token block (canonical token order)."""
    whole = _caches(blocks=2, dtype=torch.bfloat16)
    split = {k: v.view(2, 2, 4, 32, 16).permute(0, 2, 1, 3, 4).reshape(8, 2, 32, 16).contiguous() for k, v in whole.items()}
    a = PayloadLayout(whole, list(whole), BS).gather([1])
    b = PayloadLayout(split, list(split), BS, batched=batched).gather([1])
    assert torch.equal(a, b)
    back = {k: torch.zeros_like(v) for k, v in split.items()}
    PayloadLayout(back, list(back), BS, batched=batched).scatter(1, bytes(a[0].numpy()))
    for k in split:
        assert torch.equal(back[k][4:8], split[k][4:8])


@pytest.mark.parametrize("split", [1, 4])
def test_batched_copies_match_the_per_tile_ones(split):
    """The accelerator path (one indexed copy per layer) moves exactly the
    bytes of the per-tile path, for many blocks in any order, and touches no
    other block. Run here on the CPU; scripts/gpu-check.py runs it on CUDA."""
    whole = _caches(layers=4, blocks=9, dtype=torch.float16, seed=3)
    n = BS // split
    src = {k: v.view(9, 2, split, n, 16).permute(0, 2, 1, 3, 4).reshape(9 * split, 2, n, 16).contiguous()
           for k, v in whole.items()}
    ids = [7, 0, 3, 8, 5]
    tile = PayloadLayout(src, list(src), BS, batched=False)
    bat = PayloadLayout(src, list(src), BS, batched=True)
    data = tile.gather(ids)
    assert torch.equal(data, bat.gather(ids))
    payloads = [bytes(r.numpy()) for r in data]
    targets = [1, 2, 4, 6, 8]
    dst_t = {k: torch.zeros_like(v) for k, v in src.items()}
    dst_b = {k: torch.zeros_like(v) for k, v in src.items()}
    PayloadLayout(dst_t, list(dst_t), BS, batched=False).scatter_many(targets, payloads)
    PayloadLayout(dst_b, list(dst_b), BS, batched=True).scatter_many(targets, payloads)
    for k in src:
        assert torch.equal(dst_t[k], dst_b[k])
        for i, t in zip(ids, targets):
            assert torch.equal(dst_b[k][t * split:(t + 1) * split], src[k][i * split:(i + 1) * split])
        for untouched in (0, 3, 5, 7):
            assert not dst_b[k][untouched * split:(untouched + 1) * split].any()
    # Payloads already received into a host buffer's rows are not packed again.
    host = torch.stack([torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in payloads])
    dst_h = {k: torch.zeros_like(v) for k, v in src.items()}
    PayloadLayout(dst_h, list(dst_h), BS, batched=True).scatter_many(targets, [memoryview(r.numpy()) for r in host],
                                                                    host=host)
    assert all(torch.equal(dst_h[k], dst_b[k]) for k in src)
    with pytest.raises(LayoutError, match="2 block ids for 1 payloads"):
        bat.scatter_many([1, 2], payloads[:1])


def test_layout_refuses_mixed_layers():
    c = _caches()
    c["l1"] = c["l1"].to(torch.bfloat16)
    with pytest.raises(LayoutError, match="unlike the first layer"):
        PayloadLayout(c, list(c), BS)
    with pytest.raises(LayoutError, match="without layers"):
        PayloadLayout(_caches(), ["nope"], BS)


# -- breaker ----------------------------------------------------------------

def test_breaker_fails_fast_then_probes_and_logs_once(caplog):
    b = Breaker("x:1", initial=0.05, maximum=0.2)
    assert b.allow()
    with caplog.at_level(logging.INFO, logger="kvtier.vllm"):
        b.failure(OSError("refused"))
        assert not b.allow() and b.down
        for pause in (0.05, 0.1, 0.2):
            t = time.monotonic()
            while not b.allow():
                time.sleep(0.005)
            assert time.monotonic() - t >= pause * 0.8, "the pause doubles"
            b.failure(OSError("refused"))  # the probe failed
        b.success()
    assert b.allow() and not b.down
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in m for m in msgs) == 1, msgs
    assert sum("answers again" in m for m in msgs) == 1


# -- scheduler planning -------------------------------------------------------

class FakeClient:
    """Answers Lookups from a set of stored keys (or fails)."""

    def __init__(self, stored=(), fail=None):
        self.stored = set(stored)
        self.fail = fail
        self.lookups = []
        self.released = []

    def lookup(self, ns, keys, lease_ms=0, timeout=None):
        self.lookups.append((ns, len(keys), lease_ms))
        if self.fail:
            raise self.fail
        n = 0
        while n < len(keys) and keys[n] in self.stored:
            n += 1
        return SimpleNamespace(found=n, lease_id=7 if (n and lease_ms) else 0, tiers=[], lease_node="")

    def release(self, lease_id, timeout=None):
        self.released.append(lease_id)


class FakeRequest:
    def __init__(self, rid, tokens, preemptions=0):
        self.request_id = rid
        self.all_token_ids = list(tokens)
        self.num_prompt_tokens = len(tokens)
        self.num_preemptions = preemptions
        self.lora_request = None
        self.mm_features = []
        self.prompt_embeds = None
        self.cache_salt = None

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


class FakeManager:
    def __init__(self):
        self.blocks = {}

    def get_block_ids(self, rid):
        return (self.blocks[rid],)


def _sched(client, load_mode="sync", **cfg):
    from kvtier.vllm.scheduler import SchedulerSide

    conf = ConnectorConfig.from_extra({"url": "x:1", "load_mode": load_mode, **cfg})
    ident = SimpleNamespace(namespaces=lambda: ["ns"])
    s = SchedulerSide(conf, ident, client, can_load=True, can_save=True, block_size=BS, stats=StatsLog("", "t"))
    s.bind_kv_cache_manager(FakeManager())
    return s


def _out(new=(), cached=(), scheduled=None):
    """A SchedulerOutput stand-in: new = [(req_id, computed)], cached = [(req_id, computed)]."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=c) for r, c in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached], num_computed_tokens=[c for _, c in cached]),
        num_scheduled_tokens=scheduled or {},
        scheduled_spec_decode_tokens={},
    )


def test_lookup_once_hit_capped_below_prompt_and_loads_planned():
    toks = list(range(2 * BS))  # exactly 2 blocks
    keys = kvkeys.chain(toks, BS)
    c = FakeClient(stored=keys)
    s = _sched(c)
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 0) == (2 * BS - 1, False), "vLLM must compute the last token"
    assert s.get_num_new_matched_tokens(r, 0) == (2 * BS - 1, False)
    assert len(c.lookups) == 1, "one Lookup per request, however often vLLM asks"
    s._kv_cache_manager.blocks["a"] = [10, 11]
    s.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: ([10, 11],)), 2 * BS - 1)
    loads, saves = s.build(_out(new=[("a", 2 * BS - 1)], scheduled={"a": 1}))
    assert [(load.keys, load.block_ids, load.leases) for load in loads] == [(keys, [10, 11], {"ns": 7})]
    assert saves == [], "blocks kvtier holds are not stored again"


def test_local_hit_only_the_rest_is_external_and_async_flag():
    toks = list(range(4 * BS + 5))
    keys = kvkeys.chain(toks, BS)
    s = _sched(FakeClient(stored=keys), load_mode="async")
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 2 * BS) == (2 * BS, True)
    s.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4, 5],)), 2 * BS)
    loads, _ = s.build(_out())
    assert loads[0].keys == keys[2:4] and loads[0].block_ids == [3, 4] and loads[0].is_async


def test_saves_follow_chunked_prefill_and_decode():
    toks = list(range(3 * BS + 10))
    keys = kvkeys.chain(toks, BS)
    s = _sched(FakeClient())
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    s._kv_cache_manager.blocks["a"] = [7, 8, 9, 6]
    # chunk 1: 200 tokens -> block 0 complete
    _, saves = s.build(_out(new=[("a", 0)], scheduled={"a": 200}))
    assert [(x.keys, x.block_ids, x.parent) for x in saves] == [([keys[0]], [7], None)]
    # chunk 2: the rest of the prompt -> blocks 1, 2
    _, saves = s.build(_out(cached=[("a", 200)], scheduled={"a": 3 * BS + 10 - 200}))
    assert [(x.keys, x.block_ids, x.parent) for x in saves] == [(keys[1:3], [8, 9], keys[0])]
    # decode until block 3 fills: nothing until its 128th token's KV is computed
    r.all_token_ids += list(range(5000, 5000 + BS - 10))
    _, saves = s.build(_out(cached=[("a", 4 * BS - 1)], scheduled={"a": 1}))
    full = kvkeys.chain(r.all_token_ids, BS)
    assert [(x.keys, x.block_ids, x.parent) for x in saves] == [([full[3]], [6], keys[2])]


def test_preempted_request_is_looked_up_again_and_failed_loads_restored():
    toks = list(range(3 * BS))
    keys = kvkeys.chain(toks, BS)
    c = FakeClient(stored=keys[:2])
    s = _sched(c)
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 0)[0] == 2 * BS
    s.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: ([4, 5, 6],)), 2 * BS)
    s.build(_out())
    # block 5 (index 1) failed to load: storing restarts there
    s.update_connector_output(set(), {5})
    s._kv_cache_manager.blocks["a"] = [4, 5, 6]
    _, saves = s.build(_out(cached=[("a", BS)], scheduled={"a": 2 * BS}))
    assert [x.keys for x in saves] == [keys[1:3]]
    r.num_preemptions = 1
    s.get_num_new_matched_tokens(r, 0)
    assert len(c.lookups) == 2


def test_unreachable_kvtier_means_zero_tokens_and_no_repeated_waits():
    import grpc

    from kvtier import KvtierError

    c = FakeClient(fail=KvtierError(grpc.StatusCode.UNAVAILABLE, "down"))
    s = _sched(c, retry_initial_ms=60_000, retry_max_ms=60_000)
    for i in range(5):
        assert s.get_num_new_matched_tokens(FakeRequest(str(i), list(range(300))), 0) == (0, False)
    assert len(c.lookups) == 1, "the breaker skips lookups while kvtier is down"


def test_uncacheable_requests_are_neither_looked_up_nor_stored():
    c = FakeClient()
    s = _sched(c)
    r = FakeRequest("a", list(range(300)))
    r.lora_request = object()
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    s._kv_cache_manager.blocks["a"] = [1, 2]
    assert s.build(_out(new=[("a", 0)], scheduled={"a": 300})) == ([], [])
    assert c.lookups == []


def test_a_request_that_skips_the_prefix_cache_loads_nothing():
    """prompt_logprobs and some pooling requests set skip_reading_prefix_cache:
    vLLM must compute every token (its OffloadingConnector returns 0 too)."""
    toks = list(range(3 * BS))
    keys = kvkeys.chain(toks, BS)
    c = FakeClient(stored=keys)
    s = _sched(c)
    r = FakeRequest("a", toks)
    r.skip_reading_prefix_cache = True
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    assert c.lookups == [("ns", 3, 0)], "no lease for a load that never happens"
    s._kv_cache_manager.blocks["a"] = [1, 2, 3]
    _, saves = s.build(_out(new=[("a", 0)], scheduled={"a": 3 * BS}))
    assert saves == [], "the blocks kvtier holds are not stored again"


def test_blocks_computed_after_a_failed_load_are_forgotten_and_stored_again():
    """Blocks 0-5 load while the same step computes blocks 6-9; the load fails
    at block 3, so 6-9 attended to stale KV. Every rank deletes them before
    its next writes (a rank that stored them would otherwise win over the
    recomputed bytes: the first writer wins), and storing restarts at block 3
    once vLLM recomputes."""
    toks = list(range(10 * BS + 5))
    keys = kvkeys.chain(toks, BS)
    s = _sched(FakeClient(stored=keys[:6]))
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 0) == (6 * BS, False)
    ids = list(range(20, 31))
    s._kv_cache_manager.blocks["a"] = ids
    s.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: (ids,)), 6 * BS)
    loads, saves = s.build(_out(new=[("a", 6 * BS)], scheduled={"a": 4 * BS + 5}))
    assert loads[0].block_ids == ids[:6] and [x.keys for x in saves] == [keys[6:10]]
    assert s.take_forget() == []
    s.update_connector_output(set(), {ids[3]})  # vLLM recomputes from block 3
    _, saves = s.build(_out(cached=[("a", 3 * BS)], scheduled={"a": 7 * BS + 5}))
    assert s.take_forget() == keys[6:10]
    assert [(x.keys, x.block_ids, x.parent) for x in saves] == [(keys[3:10], ids[3:10], keys[2])]
    assert s.take_forget() == []


# -- worker against a real kvtier ----------------------------------------------

def _worker(server_url, caches, load_mode="sync", **cfg):
    from kvtier import Client
    from kvtier.vllm.worker import WorkerSide

    conf = ConnectorConfig.from_extra({"url": server_url, "load_mode": load_mode, **cfg})
    w = WorkerSide(conf, f"unit-{time.monotonic_ns()}", Client(server_url, timeout=10, retries=1), list(caches), BS,
                   StatsLog("", "t"))
    w.register(caches)
    return w


def test_worker_saves_then_loads_blocks_byte_exact(server):
    src = _caches(blocks=4)
    keys = kvkeys.chain(list(range(3 * BS)), BS)
    w = _worker(server.grpc, src)
    w.save([SaveSpec("r", keys[:2], [3, 0], None), SaveSpec("r", keys[2:], [2], keys[1])])
    assert w.flush(30)
    assert w.counters["saved_blocks"] == 3
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    w2 = _worker(server.grpc, dst)
    w2.namespace = w.namespace
    w2.start_load([LoadSpec("r", keys, [1, 2, 3])])
    assert w2.take_errors() == set()
    for k in src:
        assert torch.equal(dst[k][1], src[k][3]) and torch.equal(dst[k][2], src[k][0]) and torch.equal(dst[k][3], src[k][2])


def test_worker_reports_missing_wrong_size_and_unreachable(server, kvtier_bin):
    from kvtier import Block, Client
    from kvtier.server import Server

    src = _caches(blocks=4)
    keys = kvkeys.chain(list(range(3 * BS)), BS)
    w = _worker(server.grpc, src)
    w.save([SaveSpec("r", keys[:1], [0], None)])
    assert w.flush(30)
    with Client(server.grpc) as c:
        c.write(w.namespace, [Block(key=keys[1], parent=keys[0], payload=b"junk", token_count=BS)])
    w.start_load([LoadSpec("r", keys, [1, 2, 3])])
    assert w.take_errors() == {2, 3}, "block 1 loads; the junk block and the one after it fail"
    assert w.flush(30)
    with Client(server.grpc) as c:
        assert c.lookup(w.namespace, keys=keys).found == 1, "the wrong-size block was deleted"
    # A server that is gone: every block fails, nothing hangs.
    s2 = Server.start(binary=kvtier_bin)
    w2 = _worker(s2.grpc, src, load_timeout_ms=2000)
    s2.stop()
    t = time.monotonic()
    w2.start_load([LoadSpec("r", keys, [1, 2, 3])])
    assert time.monotonic() - t < 5
    assert w2.take_errors() == {1, 2, 3}


def test_a_lease_taken_by_the_scheduler_covers_the_workers_read_on_a_node_list(kvtier_bin):
    """url "a,b,c": the scheduler's and the worker's cluster clients are
    separate (separate processes in vLLM). The LoadSpec names the node that
    granted each lease, so the worker's read sends the lease id there only
    (another node refuses a lease it never granted: every block failed)
    and its release ends the lease on that node."""
    from kvtier import Client
    from kvtier.server import Server, free_port_pairs
    from kvtier.vllm.scheduler import SchedulerSide

    nodes = [f"127.0.0.1:{p}" for p in free_port_pairs(3)]
    members = ",".join(f"grpc://{n}" for n in nodes)
    started = [Server.start(binary=kvtier_bin, listen=n,
                            args=["--cluster-nodes", members, "--cluster-self", f"grpc://{n}"]) for n in nodes]
    try:
        url = ",".join(nodes)
        src = _caches(blocks=20)
        toks = list(range(16 * BS + 1))
        keys = chain_keys(toks, BS)
        w = _worker(url, src)
        w.save([SaveSpec("r", keys, list(range(16)), None)])
        assert w.flush(30) and w.counters["saved_blocks"] == 16
        assert len({kvkeys.owners(nodes, w.namespace, k)[0] for k in keys}) == 3, "the chain spans every node"

        conf = ConnectorConfig.from_extra({"url": url})
        with Client(url, timeout=10) as sc:
            s = SchedulerSide(conf, SimpleNamespace(namespaces=lambda: [w.namespace]), sc, can_load=True,
                              can_save=True, block_size=BS, stats=StatsLog("", "t"))
            r = FakeRequest("a", toks)
            assert s.get_num_new_matched_tokens(r, 0) == (16 * BS, False)
            s.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: (list(range(17)),)), 16 * BS)
            (load,), _ = s.build(_out())
            granting, = (sc.node(n) for n, st in sc.node_stats().items() if st.active_leases)
            assert granting.stats().active_leases == 1

            dst = {k: torch.zeros_like(v) for k, v in src.items()}
            w2 = _worker(url, dst)
            w2.namespace = w.namespace
            w2.start_load([load])
            assert w2.take_errors() == set() and w2.counters["loaded_blocks"] == 16
            assert all(torch.equal(dst[k][:16], src[k][:16]) for k in src)
            assert w2.flush(30)
            assert granting.stats().active_leases == 0, "the worker released it on the granting node"
            s.shutdown()
    finally:
        for srv in started:
            srv.stop()


def test_worker_async_and_layerwise_loads(server):
    src = _caches(blocks=3)
    keys = kvkeys.chain(list(range(2 * BS)), BS)
    w = _worker(server.grpc, src)
    w.save([SaveSpec("r", keys, [0, 1], None)])
    assert w.flush(30)
    # async: reported through get_finished, data in place by then
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    wa = _worker(server.grpc, dst, load_mode="async")
    wa.namespace = w.namespace
    wa.start_load([LoadSpec("q", keys, [2, 1], is_async=True)])
    end = time.monotonic() + 30
    done = set()
    while "q" not in done and time.monotonic() < end:
        done |= wa.get_finished()
        time.sleep(0.01)
    assert done == {"q"} and wa.take_errors() == set()
    assert all(torch.equal(dst[k][2], src[k][0]) for k in src)
    # layer-wise: each layer lands when its attention asks for it
    dst2 = {k: torch.zeros_like(v) for k, v in src.items()}
    wl = _worker(server.grpc, dst2, load_mode="layerwise")
    wl.namespace = w.namespace
    wl.start_load([LoadSpec("q", keys, [0, 1])])
    wl.wait_for_layer_load("l0")
    assert torch.equal(dst2["l0"][1], src["l0"][1]) and not dst2["l1"].any()
    wl.wait_for_layer_load("l1")
    wl.wait_for_layer_load("l2")
    wl.save([])
    assert wl.take_errors() == set()
    # a layer never asked for: its attention read stale KV, so the load failed
    wl.start_load([LoadSpec("q", keys, [0, 1])])
    wl.wait_for_layer_load("l0")
    wl.save([])
    assert wl.take_errors() == {0, 1}


def test_nothing_computed_after_a_failed_load_is_stored_and_the_recomputed_blocks_win(server):
    """One step: request r loads blocks 4-5 (the second is missing from
    kvtier) and computes blocks 6-7 from its stale KV. This rank stores none
    of r's new blocks (o's save of the same step goes ahead). Another rank,
    whose own load went fine, computed them from the same stale hidden states
    and stored them: the next step deletes them (the scheduler's forget list)
    before the recomputed ones are written, which would otherwise lose to the
    first writer."""
    from kvtier import Client

    keys = kvkeys.chain(list(range(4 * BS)), BS)
    other = kvkeys.chain(list(range(10**5, 10**5 + BS)), BS)
    src = _caches(blocks=8)
    w = _worker(server.grpc, src)
    w.save([SaveSpec("r", keys[:1], [0], None)])
    assert w.flush(30)
    w.start_load([LoadSpec("r", keys[:2], [4, 5])])
    w.save([SaveSpec("r", keys[2:4], [6, 7], keys[1]), SaveSpec("o", other, [3], None)])
    assert w.take_errors() == {5}
    assert w.flush(30)
    with Client(server.grpc) as c:
        assert [c.lookup(w.namespace, keys=[k]).found for k in keys[2:4]] == [0, 0], "r's blocks 6-7 not stored"
        assert c.lookup(w.namespace, keys=other).found == 1
    # the other rank: stale blocks 6-7 stored, then recomputed ones with the forget list
    kv1 = _caches(blocks=8, seed=1)
    w1 = _worker(server.grpc, kv1)
    w1.save([SaveSpec("r", keys[:4], [4, 5, 6, 7], None)])
    assert w1.flush(30) and w1.counters["saved_blocks"] == 4
    fresh = _caches(blocks=8, seed=2)
    for k in kv1:
        kv1[k][5:8] = fresh[k][5:8]
    w1.save([SaveSpec("r", keys[1:4], [5, 6, 7], keys[0])], forget=keys[2:4])
    assert w1.flush(30)
    dst = {k: torch.zeros_like(v) for k, v in kv1.items()}
    w2 = _worker(server.grpc, dst)
    w2.namespace = w1.namespace
    w2.start_load([LoadSpec("r", keys[2:4], [0, 1])])
    assert w2.take_errors() == set()
    assert all(torch.equal(dst[k][:2], fresh[k][6:8]) for k in dst), "the recomputed blocks are stored"


def test_an_async_load_without_a_usable_layout_is_still_reported_finished(server):
    """register_kv_caches refused the caches: the load fails, but vLLM must
    hear that it finished, or the request waits for its KV forever."""
    keys = kvkeys.chain(list(range(2 * BS)), BS)
    w = _worker(server.grpc, _caches(blocks=3), load_mode="async")
    w.layout = None
    w.start_load([LoadSpec("q", keys, [1, 2], is_async=True)])
    assert w.get_finished() == {"q"}
    assert w.take_errors() == {1, 2}
