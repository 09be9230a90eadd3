"""Unit tests of the vLLM connector's worker side against a real kvtier
server: saves and loads byte-exact, failures reported per block, leases on a
node list, async and layer-wise loads."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from kvtier import keys as kvkeys
from kvtier.vllm.common import LoadSpec, SaveSpec, StatsLog, chain_keys
from kvtier.vllm.config import ConnectorConfig

from conftest import BS, FakeRequest, make_caches, sched_output


def _worker(server_url, caches, load_mode="sync", **cfg):
    from kvtier import Client
    from kvtier.vllm.worker import WorkerSide

    conf = ConnectorConfig.from_extra({"url": server_url, "load_mode": load_mode, **cfg})
    w = WorkerSide(conf, f"unit-{time.monotonic_ns()}", Client(server_url, timeout=10, retries=1), list(caches), BS,
                   StatsLog("", "t"))
    w.register(caches)
    return w


def test_worker_saves_then_loads_blocks_byte_exact(server):
    src = make_caches(blocks=4)
    keys = kvkeys.chain(list(range(3 * BS)), BS)
    w = _worker(server.grpc, src)
    w.save([SaveSpec("r", keys[:2], [3, 0], None), SaveSpec("r", keys[2:], [2], keys[1])])
    assert w.flush(30)
    assert w.counters["saved_blocks"] == 3
    # Over TCP, "auto" stages the blocks; "always" lands them in place (a
    # contiguous CPU cache: a region per layer).
    for in_place, want in (("auto", 0), ("always", 3)):
        dst = {k: torch.zeros_like(v) for k, v in src.items()}
        w2 = _worker(server.grpc, dst, load_in_place=in_place)
        w2.namespace = w.namespace
        events = []
        w2.stats = lambda event, _ev=events, **f: _ev.append((event, f))
        w2.start_load([LoadSpec("r", keys, [1, 2, 3])])
        assert w2.take_errors() == set()
        loads = [f for e, f in events if e == "load"]
        assert [(f["loaded"], f["in_place"]) for f in loads] == [(3, want)], events
        for k in src:
            assert torch.equal(dst[k][1], src[k][3]) and torch.equal(dst[k][2], src[k][0])
            assert torch.equal(dst[k][3], src[k][2])


def test_worker_reports_missing_wrong_size_and_unreachable(server, kvtier_bin):
    from kvtier import Block, Client
    from kvtier.server import Server

    src = make_caches(blocks=4)
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
    # It counts as an outage: the next load fails at once, without a call.
    assert not w2.breaker.allow(), "an unreachable server did not open the breaker"


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
        src = make_caches(blocks=20)
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
            (load,), _ = s.build(sched_output())
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
    src = make_caches(blocks=3)
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


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "staged"])
def test_worker_layerwise_loads(server, in_place):
    """Layer-wise: each layer is in vLLM's cache when its attention asks for
    it. Read in place (a contiguous cache) every layer lands with the read;
    staged (a cache whose tiles are strided), each layer is copied in then."""
    src = make_caches(blocks=3)
    keys = kvkeys.chain(list(range(2 * BS)), BS)
    w = _worker(server.grpc, src)
    w.save([SaveSpec("r", keys, [0, 1], None)])
    assert w.flush(30)
    dst2 = {k: torch.zeros_like(v) for k, v in src.items()}
    if not in_place:  # the same logical view over token-major memory
        dst2 = {k: v.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for k, v in dst2.items()}
    wl = _worker(server.grpc, dst2, load_mode="layerwise", load_in_place="always")
    assert wl.layout.loads_in_place == in_place
    wl.namespace = w.namespace
    wl.start_load([LoadSpec("q", keys, [0, 1])])
    wl.wait_for_layer_load("l0")
    assert torch.equal(dst2["l0"][1], src["l0"][1])
    assert torch.equal(dst2["l1"][1], src["l1"][1]) if in_place else not dst2["l1"].any()
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
    src = make_caches(blocks=8)
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
    kv1 = make_caches(blocks=8, seed=1)
    w1 = _worker(server.grpc, kv1)
    w1.save([SaveSpec("r", keys[:4], [4, 5, 6, 7], None)])
    assert w1.flush(30) and w1.counters["saved_blocks"] == 4
    fresh = make_caches(blocks=8, seed=2)
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
    w = _worker(server.grpc, make_caches(blocks=3), load_mode="async")
    w.layout = None
    w.start_load([LoadSpec("q", keys, [1, 2], is_async=True)])
    assert w.get_finished() == {"q"}
    assert w.take_errors() == {1, 2}


@pytest.mark.parametrize("mode", ["sync", "layerwise"])
def test_mapped_loads_land_byte_exact_and_give_their_slots_back(kvtier_bin, tmp_path, mode):
    """``load_mapped``: the worker reads with ``Client.map_read`` and copies
    from kvtier's shared memory (on a GPU the copy is a DMA from the pinned
    mapping; here, on the CPU, the same path with the CPU copying). Every
    block lands byte-exact, sync and layer-wise."""
    from kvtier.server import Server

    sock = tmp_path / "kvtier.sock"
    s = Server.start(binary=kvtier_bin, args=["--local-listen", str(sock), "--memory-capacity", "256MiB"])
    try:
        url = f"unix://{sock}"
        src = make_caches(blocks=4)
        keys = kvkeys.chain(list(range(3 * BS)), BS)
        w = _worker(url, src)
        w.save([SaveSpec("r", keys, [3, 0, 2], None)])
        assert w.flush(30)
        dst = {k: torch.zeros_like(v) for k, v in src.items()}
        w2 = _worker(url, dst, load_mode=mode, load_mapped="always")
        w2.namespace = w.namespace
        assert w2._mapped()
        spec = LoadSpec("r", keys, [1, 2, 3])
        w2.start_load([spec])
        if mode == "layerwise":
            for name in w2.layer_names:
                w2.wait_for_layer_load(name)
            w2._finish_layerwise()
        assert w2.take_errors() == set()
        for k in src:
            assert torch.equal(dst[k][1], src[k][3]) and torch.equal(dst[k][2], src[k][0])
            assert torch.equal(dst[k][3], src[k][2])
        assert w2.counters["loaded_blocks"] == 3
        # "never" and "auto" on a CPU cache: not mapped.
        assert not _worker(url, dst, load_mapped="never")._mapped()
        assert not _worker(url, dst)._mapped()
    finally:
        assert s.stop() == 0
