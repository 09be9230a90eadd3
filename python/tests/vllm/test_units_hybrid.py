"""Unit tests of the scheduler side with several KV-cache groups (a hybrid
model, docs/vllm.md "Hybrid models"): what is looked up, loaded and stored
per group, with vLLM's own spec objects and stand-ins for its requests,
block tables and kvtier's client. The engine tests are in test_hybrid.py."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from kvtier import keys as kvkeys
from kvtier.vllm.common import StatsLog
from kvtier.vllm.config import ConnectorConfig

from conftest import BS, FakeRequest, sched_output

WINDOW = 2 * BS  # a hit of h tokens keeps blocks from (h - WINDOW + 1) // BS on
NULL = 0


class Stores:
    """kvtier stand-in: per namespace, the keys present; records every Lookup."""

    def __init__(self):
        self.keys: dict[str, set] = {}
        self.lookups: list[tuple[str, list]] = []
        self.released: list[int] = []

    def lookup(self, ns, keys, lease_ms=0, timeout=None):
        self.lookups.append((ns, list(keys)))
        have = self.keys.get(ns, set())
        n = 0
        while n < len(keys) and keys[n] in have:
            n += 1
        return SimpleNamespace(found=n, lease_id=len(self.lookups) if (n and lease_ms) else 0, tiers=[],
                               lease_node="")

    def release(self, lease_id, timeout=None):
        self.released.append(lease_id)


class Manager:
    def __init__(self):
        self.blocks: dict[str, tuple] = {}

    def get_block_ids(self, rid):
        return self.blocks[rid]


def _specs():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    common = dict(block_size=BS, num_kv_heads=2, head_size=64, dtype=torch.float32)
    return [SlidingWindowSpec(sliding_window=WINDOW, **common), FullAttentionSpec(**common)]


def _setup(tokens: int, window_keys=slice(None)):
    """A prompt of ``tokens`` tokens, its keys, and a scheduler whose kvtier
    holds every key of the global group (ns1) and ``window_keys`` of the
    window group's (ns0)."""
    toks = list(range(tokens))
    keys = kvkeys.chain(toks, BS)
    c = Stores()
    c.keys["ns1"] = set(keys)
    c.keys["ns0"] = set(keys[window_keys])
    return toks, keys, c, _sched(c)


def _sched(client, specs=None, **cfg):
    """A scheduler over ``specs`` (default :func:`_specs`: a window group 0, a global group 1)."""
    from kvtier.vllm.scheduler import SchedulerSide

    conf = ConnectorConfig.from_extra({"url": "x:1", **cfg})
    ident = SimpleNamespace(namespaces=lambda g=0: [f"ns{g}"])
    s = SchedulerSide(conf, ident, client, can_load=True, can_save=True, block_size=BS, stats=StatsLog("", "t"),
                      specs=specs if specs is not None else _specs())
    s.bind_kv_cache_manager(Manager())
    return s


def test_a_hit_needs_the_full_groups_prefix_and_only_the_window_of_the_others():
    toks = list(range(8 * BS + 5))
    keys = kvkeys.chain(toks, BS)
    c = Stores()
    c.keys["ns1"] = set(keys)            # the global group holds all 8 blocks
    c.keys["ns0"] = set(keys[6:8])       # the window group only blocks 6, 7: the window at 8 blocks
    s = _sched(c)
    assert s.get_num_new_matched_tokens(FakeRequest("a", toks), 0) == (8 * BS, True), "hybrid loads are async"
    assert c.lookups == [("ns1", keys), ("ns0", keys[6:8])], "the window group is asked for its window only"


def test_a_window_missing_a_block_moves_the_hit_before_it():
    toks, keys, c, s = _setup(8 * BS + 5, slice(0, 7))  # block 7 is missing
    c.keys["ns0"].discard(keys[3])  # and block 3
    # Hit 8 needs 6, 7: 7 is missing -> hit 7 needs 5, 6: present.
    assert s.get_num_new_matched_tokens(FakeRequest("a", toks), 0) == (7 * BS, True)
    assert [k for _, k in c.lookups[1:]] == [keys[6:8], keys[5:7]]
    s._releaser.shutdown(wait=True)
    assert c.released == [2], "the failed attempt's lease is given back, the hit's kept"


def test_no_hit_when_the_window_keeps_moving_back():
    toks, _, _, s = _setup(8 * BS + 5, slice(0, 0))
    assert s.get_num_new_matched_tokens(FakeRequest("a", toks), 0) == (0, False)


def test_loads_skip_the_null_blocks_of_a_window_group_and_every_group_reports():
    toks, keys, _, s = _setup(8 * BS + 5)
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 2 * BS) == (6 * BS, True)
    window = [NULL] * 6 + [16, 17, 18]   # vLLM's null block before the window
    full = list(range(30, 39))
    s.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: (window, full)), 6 * BS)
    loads, _ = s.build(sched_output())
    by_group = {spec.group: spec for spec in loads}
    assert by_group[0].keys == keys[6:8] and by_group[0].block_ids == [16, 17]
    assert by_group[1].keys == keys[2:8] and by_group[1].block_ids == full[2:8]
    assert all(spec.is_async for spec in loads)


def test_saves_go_per_group_and_window_blocks_are_stored_unlinked():
    toks = list(range(3 * BS + 10))
    keys = kvkeys.chain(toks, BS)
    s = _sched(Stores())
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    s._kv_cache_manager.blocks["a"] = ([NULL, 5, 6, 7], [1, 2, 3, 4])  # block 0 of the window group already gone
    _, saves = s.build(sched_output(new=[("a", 0)], scheduled={"a": 3 * BS + 10}))
    by_group = {spec.group: spec for spec in saves}
    assert by_group[1].keys == keys and by_group[1].block_ids == [1, 2, 3] and by_group[1].chained
    assert by_group[0].keys == keys[1:] and by_group[0].block_ids == [5, 6]
    assert not by_group[0].chained and by_group[0].parent is None


def test_a_failed_hybrid_load_is_a_miss_next_time_and_stores_again():
    toks, keys, _, s = _setup(4 * BS + 5)
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 0)[0] == 4 * BS
    s.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])), 4 * BS)
    s.build(sched_output())
    s.update_connector_output({"a"}, None, {"a"})
    # vLLM recomputes the prompt and asks again: a miss, not the same failing load.
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    s._kv_cache_manager.blocks["a"] = ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    _, saves = s.build(sched_output(new=[("a", 0)], scheduled={"a": 4 * BS + 5}))
    assert sorted(len(spec.keys) for spec in saves) == [4, 4], "every block is stored again"


def _state_sched(client):
    """A scheduler for a Mamba hybrid: a state group (0) and a global group (1)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    return _sched(client, [MambaSpec(block_size=BS, shapes=((3, 64),), dtypes=(torch.float32,),
                                     mamba_cache_mode="align"),
                           FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=64, dtype=torch.float32)])


def test_a_state_hit_ends_on_a_block_boundary_and_loads_only_the_state_there():
    toks = list(range(4 * BS))  # a block-aligned prompt: the last block must be recomputed whole
    keys = kvkeys.chain(toks, BS)
    c = Stores()
    c.keys["ns1"] = set(keys)
    c.keys["ns0"] = {keys[2]}  # vLLM kept the state after block 2 only
    s = _state_sched(c)
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 0) == (3 * BS, True)
    assert c.lookups[-1] == ("ns0", [keys[2]]), "a state group is asked for the state at the hit only"
    # vLLM: the hit's state block (21) after nulls or blocks it still holds
    # (20: a checkpoint), then the running state's block.
    state = [NULL, 20, 21, 22]
    s.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: (state, [5, 6, 7, 8])), 3 * BS)
    loads, _ = s.build(sched_output())
    by_group = {spec.group: spec for spec in loads}
    assert by_group[0].keys == [keys[2]] and by_group[0].block_ids == [21]
    assert by_group[1].keys == keys[:3]


def test_states_are_stored_from_vllms_hand_offs_only_for_live_requests_and_whole_blocks():
    toks = list(range(3 * BS + 10))
    keys = kvkeys.chain(toks, BS)
    s = _state_sched(Stores())
    for rid in ("a", "gone", "pre"):
        assert s.get_num_new_matched_tokens(FakeRequest(rid, toks), 0) == (0, False)
        s._kv_cache_manager.blocks[rid] = ([NULL, NULL, 9, NULL], [1, 2, 3, 4])
    out = sched_output(new=[("a", 0), ("gone", 0), ("pre", 0)], scheduled={r: 3 * BS + 10 for r in ("a", "gone", "pre")})
    out.finished_req_ids = {"gone"}
    out.preempted_req_ids = {"pre"}
    out.kv_connector_block_state = SimpleNamespace(boundary_state_offloads={
        "a": [(0, 9, 3 * BS), (0, 8, 3 * BS + 10)],  # a whole block's state, and a partial tail's
        "gone": [(0, 19, 3 * BS)], "pre": [(0, 29, 3 * BS)],
    })
    _, saves = s.build(out)
    states = [spec for spec in saves if spec.group == 0]
    assert [(sp.req_id, sp.keys, sp.block_ids, sp.chained) for sp in states] == [("a", [keys[2]], [9], False)]
    # The state group's block table is never read positionally (9 is there, but only as an offer).
    assert all(sp.group == 1 or sp.block_ids == [9] for sp in saves)


class _RacyWorker:
    """A worker side whose load thread ends between two calls: it records the
    failure and then reports the load done (worker.WorkerSide._load_async),
    so both become visible at once when the connector asks."""

    def __init__(self):
        self.ended = False
        self.reported = False

    def get_finished(self):
        self.ended = True  # the thread ran to its end just now
        if self.reported:
            return set()
        self.reported = True
        return {"a"}

    def take_failed(self):
        return {"a"} if self.ended else set()

    def take_errors(self):
        return {3, 4}


def test_a_failed_hybrid_load_is_never_reported_as_loaded():
    from kvtier.vllm.connector import KvtierConnector

    c = object.__new__(KvtierConnector)  # (the worker-side aggregation only)
    c._workers, c._per_request, c._recv_left, c._recv_failed = [_RacyWorker()], True, {"a": 1}, set()
    r = c.get_transfer_results(set())
    assert r.finished_recving == {"a"} and r.failed_recving == {"a"}
    assert c._recv_failed == set() and c._recv_left == {}
    # Per-request failures are never also reported as block ids (vLLM would
    # restart a window or state group at a null block).
    assert c.get_block_ids_with_load_errors() == set()


def test_a_single_window_group_fails_loads_per_request_and_loads_async():
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    from kvtier.vllm.scheduler import SchedulerSide

    conf = ConnectorConfig.from_extra({"url": "x:1", "load_mode": "sync"})
    sw = SlidingWindowSpec(block_size=BS, num_kv_heads=2, head_size=64, dtype=torch.float32, sliding_window=WINDOW)
    s = SchedulerSide(conf, SimpleNamespace(namespaces=lambda g=0: ["ns0"]), Stores(), can_load=True, can_save=True,
                      block_size=BS, stats=StatsLog("", "t"), specs=[sw])
    assert s.hybrid, "a window group cannot restart at a failed block: whole-request failures, async loads"
