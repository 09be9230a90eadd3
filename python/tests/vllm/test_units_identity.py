"""Unit tests of the vLLM connector's config, the engine identity its
namespace is made from, and its chain keys. The other unit tests are in
test_units_layout.py (payload bytes), test_units_scheduler.py (load/save
planning) and test_units_worker.py (the worker against a real kvtier); the
engine-level behaviour is in test_engine.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvtier import keys as kvkeys
from kvtier.vllm.common import chain_keys
from kvtier.vllm.config import ConnectorConfig
from kvtier.vllm.identity import EngineIdentity, unsupported_reason, weights_fingerprint

from conftest import BS

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
    assert c.load_in_place == "auto"
    with pytest.raises(ValueError, match="load_in_place"):
        ConnectorConfig.from_extra({"url": "x:1", "load_in_place": "yes"})
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


def test_single_group_namespaces_are_the_ones_stored_before_hybrid_support(tmp_path):
    """Blocks stored by an engine with one KV-cache group stay reachable: its
    namespaces are pinned (computed by the identity code before groups
    entered it)."""
    vc, kv = _configs(tmp_path / "nonexistent")
    assert EngineIdentity(vc, kv, "org/model@rev1").namespaces() == ["vllm/model-rev1/203ff498251c8062b3b5"]
    vc, kv = _configs(tmp_path / "nonexistent", tp=2)
    assert EngineIdentity(vc, kv, "org/model@rev1").namespaces() == [
        "vllm/model-rev1/2f9027d61c5a08de8b54", "vllm/model-rev1/b64b7fee84d383479798"]


def _hybrid(tmp_path, specs):
    vc, _ = _configs(tmp_path)
    groups = [SimpleNamespace(kv_cache_spec=sp, layer_names=[f"model.layers.{i}.self_attn.attn"])
              for i, sp in enumerate(specs)]
    return vc, SimpleNamespace(kv_cache_groups=groups)


def test_every_group_of_a_hybrid_model_gets_its_own_namespace(tmp_path):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    sw = SlidingWindowSpec(block_size=BS, num_kv_heads=2, head_size=64, dtype=torch.float32, sliding_window=256)
    full = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=64, dtype=torch.float32)
    vc, kv = _hybrid(tmp_path, [sw, sw, full])
    ident = EngineIdentity(vc, kv, "org/model@rev1")
    names = [ident.namespace(0, 0, g) for g in range(3)]
    assert len(set(names)) == 3, "two groups must never share a key"
    assert ident.namespaces(1) == [names[1]]
    assert names[0] != EngineIdentity(*_configs(tmp_path), "org/model@rev1").namespace()


def test_unsupported_kv_caches_are_named(tmp_path):
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, MambaSpec, SlidingWindowSpec

    assert unsupported_reason(_configs(tmp_path)[1]) == ""
    # A sliding-window layer vLLM runs as full attention (hybrid manager off) keeps every block.
    assert unsupported_reason(_configs(tmp_path, window=64)[1]) == ""
    assert unsupported_reason(_configs(tmp_path, groups=2)[1]) == ""
    common = dict(num_kv_heads=2, head_size=64, dtype=torch.float32)
    sw = SlidingWindowSpec(block_size=BS, sliding_window=256, **common)
    local = ChunkedLocalAttentionSpec(block_size=BS, attention_chunk_size=512, **common)
    full = FullAttentionSpec(block_size=BS, **common)
    assert unsupported_reason(_hybrid(tmp_path, [sw, local, full])[1]) == ""
    mamba = MambaSpec(block_size=BS, shapes=((3, 64),), dtypes=(torch.float32,), mamba_cache_mode="none")
    why = unsupported_reason(_hybrid(tmp_path, [mamba, full])[1])
    assert "group 0" in why and "state-space" in why and "mamba_cache_mode='none'" in why
    align = MambaSpec(block_size=BS, shapes=((3, 64),), dtypes=(torch.float32,), mamba_cache_mode="align")
    assert unsupported_reason(_hybrid(tmp_path, [align, full])[1]) == ""
    why = unsupported_reason(_hybrid(tmp_path, [FullAttentionSpec(block_size=64, **common), full])[1])
    assert "block sizes [64, 128]" in why


def test_skipped_tokens_are_vllms_own():
    """The window a hit needs is where vLLM's managers put null blocks."""
    from types import SimpleNamespace as NS

    from vllm.v1.core.single_type_kv_cache_manager import ChunkedLocalAttentionManager, SlidingWindowManager
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, SlidingWindowSpec

    from kvtier.vllm.identity import skipped_tokens

    common = dict(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
    for window in (16, 100, 256):
        sw = SlidingWindowSpec(sliding_window=window, **common)
        for n in (0, 1, 15, 16, 17, 255, 256, 1000, 4097):
            want = SlidingWindowManager.get_num_skipped_tokens(NS(sliding_window=window, extra_retained_tokens=0), n)
            assert skipped_tokens(sw, n) == want, (window, n)
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager
    from vllm.v1.kv_cache_interface import MambaSpec

    mamba = MambaSpec(block_size=16, shapes=((3, 64),), dtypes=(torch.float32,), mamba_cache_mode="align")
    for n in (1, 16, 17, 4096):
        assert skipped_tokens(mamba, n) == MambaManager.get_num_skipped_tokens(NS(), n), n
    for chunk in (64, 512):
        local = ChunkedLocalAttentionSpec(attention_chunk_size=chunk, **common)
        for n in (0, 1, 63, 64, 65, 1000, 4097):
            want = ChunkedLocalAttentionManager.get_num_skipped_tokens(NS(attention_chunk_size=chunk), n)
            assert skipped_tokens(local, n) == want, (chunk, n)


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
