"""Unit tests of the vLLM connector's scheduler side: the circuit breaker
that keeps an unreachable kvtier from stalling scheduling, and the
scheduler's load/save planning, with stand-ins for vLLM's request objects
and kvtier's client."""
from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from kvtier import keys as kvkeys
from kvtier.vllm.common import Breaker, StatsLog
from kvtier.vllm.config import ConnectorConfig

from conftest import BS, FakeRequest, sched_output

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


class FakeManager:
    """A stand-in for vLLM's KV-cache manager: each request's block ids."""

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
    loads, saves = s.build(sched_output(new=[("a", 2 * BS - 1)], scheduled={"a": 1}))
    assert [(load.keys, load.block_ids, load.leases) for load in loads] == [(keys, [10, 11], {"ns": 7})]
    assert saves == [], "blocks kvtier holds are not stored again"


def test_local_hit_only_the_rest_is_external_and_async_flag():
    toks = list(range(4 * BS + 5))
    keys = kvkeys.chain(toks, BS)
    s = _sched(FakeClient(stored=keys), load_mode="async")
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 2 * BS) == (2 * BS, True)
    s.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4, 5],)), 2 * BS)
    loads, _ = s.build(sched_output())
    assert loads[0].keys == keys[2:4] and loads[0].block_ids == [3, 4] and loads[0].is_async


def test_saves_follow_chunked_prefill_and_decode():
    toks = list(range(3 * BS + 10))
    keys = kvkeys.chain(toks, BS)
    s = _sched(FakeClient())
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    s._kv_cache_manager.blocks["a"] = [7, 8, 9, 6]
    # chunk 1: 200 tokens -> block 0 complete
    _, saves = s.build(sched_output(new=[("a", 0)], scheduled={"a": 200}))
    assert [(x.keys, x.block_ids, x.parent) for x in saves] == [([keys[0]], [7], None)]
    # chunk 2: the rest of the prompt -> blocks 1, 2
    _, saves = s.build(sched_output(cached=[("a", 200)], scheduled={"a": 3 * BS + 10 - 200}))
    assert [(x.keys, x.block_ids, x.parent) for x in saves] == [(keys[1:3], [8, 9], keys[0])]
    # decode until block 3 fills: nothing until its 128th token's KV is computed
    r.all_token_ids += list(range(5000, 5000 + BS - 10))
    _, saves = s.build(sched_output(cached=[("a", 4 * BS - 1)], scheduled={"a": 1}))
    full = kvkeys.chain(r.all_token_ids, BS)
    assert [(x.keys, x.block_ids, x.parent) for x in saves] == [([full[3]], [6], keys[2])]


def test_saves_carry_their_token_ids_unless_salted_or_turned_off():
    """Each full-attention block goes with its tokens, for kvtier's KV events
    (docs/events.md); a salted request's never leave, nor anyone's with
    send_token_ids off."""
    toks = list(range(2 * BS))

    def saved(salt=None, **cfg):
        s = _sched(FakeClient(), **cfg)
        r = FakeRequest("a", toks)
        r.cache_salt = salt
        s.get_num_new_matched_tokens(r, 0)
        s._kv_cache_manager.blocks["a"] = [7, 8]
        _, saves = s.build(sched_output(new=[("a", 0)], scheduled={"a": 2 * BS}))
        return [x.tokens for x in saves]

    assert saved() == [toks]
    assert saved(salt="tenant-secret") == [[]]
    assert saved(send_token_ids=False) == [[]]


def test_preempted_request_is_looked_up_again_and_failed_loads_restored():
    toks = list(range(3 * BS))
    keys = kvkeys.chain(toks, BS)
    c = FakeClient(stored=keys[:2])
    s = _sched(c)
    r = FakeRequest("a", toks)
    assert s.get_num_new_matched_tokens(r, 0)[0] == 2 * BS
    s.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: ([4, 5, 6],)), 2 * BS)
    s.build(sched_output())
    # block 5 (index 1) failed to load: storing restarts there
    s.update_connector_output(set(), {5})
    s._kv_cache_manager.blocks["a"] = [4, 5, 6]
    _, saves = s.build(sched_output(cached=[("a", BS)], scheduled={"a": 2 * BS}))
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
    assert s.build(sched_output(new=[("a", 0)], scheduled={"a": 300})) == ([], [])
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
    _, saves = s.build(sched_output(new=[("a", 0)], scheduled={"a": 3 * BS}))
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
    loads, saves = s.build(sched_output(new=[("a", 6 * BS)], scheduled={"a": 4 * BS + 5}))
    assert loads[0].block_ids == ids[:6] and [x.keys for x in saves] == [keys[6:10]]
    assert s.take_forget() == []
    s.update_connector_output(set(), {ids[3]})  # vLLM recomputes from block 3
    _, saves = s.build(sched_output(cached=[("a", 3 * BS)], scheduled={"a": 7 * BS + 5}))
    assert s.take_forget() == keys[6:10]
    assert [(x.keys, x.block_ids, x.parent) for x in saves] == [(keys[3:10], ids[3:10], keys[2])]
    assert s.take_forget() == []


# -- prefill/decode split ------------------------------------------------------

def _role_sched(client, can_load, can_save, **cfg):
    from kvtier.vllm.scheduler import SchedulerSide

    conf = ConnectorConfig.from_extra({"url": "x:1", **cfg})
    ident = SimpleNamespace(namespaces=lambda: ["ns"])
    s = SchedulerSide(conf, ident, client, can_load=can_load, can_save=can_save, block_size=BS,
                      stats=StatsLog("", "t"))
    s.bind_kv_cache_manager(FakeManager())
    return s


def test_producer_announces_the_blocks_it_stored():
    toks = list(range(3 * BS + 7))
    s = _role_sched(FakeClient(), can_load=False, can_save=True)
    r = FakeRequest("p", toks)
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    s._kv_cache_manager.blocks["p"] = [1, 2, 3, 4]
    _, saves = s.build(sched_output(new=[("p", 0)], scheduled={"p": len(toks)}))
    assert sum(len(x.keys) for x in saves) == 3
    assert s.request_finished(r) == {"kvtier_blocks": 3}
    # an engine that also loads (kv_both) announces only when the router asks
    both = _role_sched(FakeClient(), can_load=True, can_save=True)
    r2 = FakeRequest("q", toks)
    both.get_num_new_matched_tokens(r2, 0)
    assert both.request_finished(r2) is None
    r3 = FakeRequest("r", toks)
    r3.kv_transfer_params = {"do_remote_decode": True}
    both.get_num_new_matched_tokens(r3, 0)
    assert both.request_finished(r3) == {"kvtier_blocks": 0}
    # kv_transfer_params come from the client: a malformed value is ignored, never an error
    for bad in (["do_remote_decode"], "x", {"do_remote_decode": "yes"}):
        r4 = FakeRequest(f"s{bad!r}", toks)
        r4.kv_transfer_params = bad
        both.get_num_new_matched_tokens(r4, 0)
        assert both.request_finished(r4) is None, bad


def test_consumer_waits_for_announced_blocks_then_loads_them():
    toks = list(range(3 * BS + 7))
    keys = kvkeys.chain(toks, BS)
    c = FakeClient(stored=keys[:1])  # the producer's writes are still arriving
    s = _role_sched(c, can_load=True, can_save=False)
    r = FakeRequest("d", toks)
    r.kv_transfer_params = {"kvtier_blocks": 3}
    assert s.get_num_new_matched_tokens(r, 0) == (None, False), "fewer blocks than announced: wait"
    assert c.released == [7], "the partial hit's lease is given back while waiting"
    assert s.get_num_new_matched_tokens(r, 0) == (None, False)
    assert len(c.lookups) == 1, "asked again only after the probe interval"
    c.stored.update(keys)
    time.sleep(0.01)
    assert s.get_num_new_matched_tokens(r, 0) == (3 * BS, False)
    assert len(c.lookups) == 2


def test_consumer_stops_waiting_at_its_load_deadline():
    toks = list(range(2 * BS + 3))
    keys = kvkeys.chain(toks, BS)
    c = FakeClient(stored=keys[:1])
    s = _role_sched(c, can_load=True, can_save=False, load_timeout_ms=30)
    r = FakeRequest("d", toks)
    r.kv_transfer_params = {"kvtier_blocks": 2}
    end = time.monotonic() + 5
    got = s.get_num_new_matched_tokens(r, 0)
    while got[0] is None and time.monotonic() < end:
        time.sleep(0.002)
        got = s.get_num_new_matched_tokens(r, 0)
    assert got == (BS, False), "past the deadline the request takes what is there"
    # without an announcement nothing waits
    r2 = FakeRequest("e", toks)
    assert s.get_num_new_matched_tokens(r2, 0) == (BS, False)
    for bad in ({"kvtier_blocks": "3"}, {"kvtier_blocks": True}, ["x"]):
        r3 = FakeRequest(f"f{bad!r}", toks)
        r3.kv_transfer_params = bad
        assert s.get_num_new_matched_tokens(r3, 0) == (BS, False), bad
