"""The cluster client (kvtier.cluster) against three real kvtier servers.

The servers are independent (not a cluster), which is what makes the
client's own placement visible: a block is on the node the client sent it
to and nowhere else, so each test can check where every block went with a
single-address client per node.
"""
from __future__ import annotations

import os
import random

import pytest

from kvtier import Block, Client, ClusterClient, KvtierError, ServerTiming, Tier, keys
from kvtier.pb import v1 as pb
from kvtier.server import Server

BS = 128


@pytest.fixture
def servers(kvtier_bin):
    """Three independent servers on ephemeral ports; stopped (by their own PIDs) at the end."""
    started: list[Server] = []
    try:
        for _ in range(3):
            started.append(Server.start(binary=kvtier_bin))
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture
def singles(servers):
    """One single-address client per server, by node name."""
    cs = {s.grpc: Client(s.grpc, connections=1, timeout=10.0) for s in servers}
    yield cs
    for c in cs.values():
        c.close()


def random_keys(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(8) for _ in range(n)]


def blocks_of(ks: list[bytes], seed: int) -> list[Block]:
    rng = random.Random(seed)
    return [Block(key=k, payload=rng.randbytes(rng.randrange(1, 64 << 10))) for k in ks]


def holders(singles: dict[str, Client], ns: str, key: bytes) -> set[str]:
    """The nodes that have ``key`` (each asked on its own)."""
    return {n for n, c in singles.items() if c.lookup(ns, keys=[key]).found == 1}


def test_a_list_or_commas_make_a_cluster_client():
    with Client(["grpc://127.0.0.1:1", "127.0.0.1:2"], connections=1, timeout=3.0, replicas=1) as c:
        assert isinstance(c, ClusterClient)
        assert c.nodes == ["127.0.0.1:1", "127.0.0.1:2"]
        assert c.replicas == 1 and c.timeout == 3.0
        assert c.node("127.0.0.1:2").connections == 1 and c.node("127.0.0.1:2").timeout == 3.0
    with Client(" 127.0.0.1:1, 127.0.0.1:2 ,") as c:
        assert isinstance(c, ClusterClient) and c.nodes == ["127.0.0.1:1", "127.0.0.1:2"]
        assert c.replicas == keys.DEFAULT_REPLICAS
    with Client("127.0.0.1:1") as single:
        assert type(single) is Client
    with pytest.raises(ValueError, match="twice"):
        Client(["127.0.0.1:1", "grpc://127.0.0.1:1"])
    with pytest.raises(ValueError, match="at least one"):
        Client([])
    with pytest.raises(ValueError, match="replicas"):
        Client(["127.0.0.1:1"], replicas=0)


def test_peer_tier_and_peer_storage_time():
    assert Tier.of(pb.TIER_PEER) is Tier.PEER and Tier.PEER == 4
    t = ServerTiming._from_pb(pb.ServerTiming(service_us=50, storage_memory_us=3, storage_disk_us=5,
                                              storage_object_us=7, storage_peer_us=11, total_us=60), 100)
    assert t.storage_peer_us == 11 and t.storage_us == 26 and t.network_us == 40


@pytest.mark.parametrize("data_plane", [True, False], ids=["data-plane", "grpc"])
def test_blocks_land_on_their_first_owner_and_read_back_in_order(servers, singles, ns, data_plane):
    nodes = [s.grpc for s in servers]
    ks = random_keys(60, seed=1)
    bs = blocks_of(ks, seed=2)
    with Client(nodes, connections=2, timeout=30.0, data_plane=data_plane) as c:
        w = c.write(ns, bs)
        assert (w.stored, w.existing) == (60, 0)
        assert w.timing.elapsed_us > 0 and w.timing.total_us > 0
        firsts = [keys.owners(nodes, ns, k)[0] for k in ks]
        assert set(firsts) == set(nodes), "60 keys reach every node"
        for k, first in zip(ks, firsts):
            assert holders(singles, ns, k) == {first}

        r = c.read(ns, ks)
        assert not r.partial and r.reason == "" and r.requested == 60
        assert [b.index for b in r.blocks] == list(range(60))
        assert [b.key for b in r.blocks] == ks
        assert r.payloads == [b.payload for b in bs]

        # into(index, nbytes) sees the index in the caller's list, whichever node answers.
        bufs = [bytearray(len(b.payload)) for b in bs]
        asked: list[int] = []

        def into(i, n):
            asked.append(i)
            return bufs[i]

        r = c.read(ns, ks, into=into)
        assert sorted(asked) == list(range(60))
        assert [bytes(b.payload) for b in r.blocks] == [b.payload for b in bs]
        assert [bytes(b) for b in bufs] == [b.payload for b in bs]

        assert c.write(ns, bs).existing == 60
        s = c.stats()
        assert s.tier(Tier.MEMORY).blocks == 60 == sum(
            st.tier(Tier.MEMORY).blocks for st in c.node_stats().values() if not isinstance(st, KvtierError))
        assert s.version and s.data_listen == ""


def test_read_asks_the_next_owner_then_stops_at_the_first_missing(servers, singles, ns):
    nodes = [s.grpc for s in servers]
    ks = random_keys(6, seed=3)
    bs = blocks_of(ks, seed=4)
    with Client(nodes, timeout=30.0) as c:
        c.write(ns, bs[:2])
        # Block 2 only on its second owner, block 3 only on its third: outside replicas=2.
        singles[keys.owners(nodes, ns, ks[2], 3)[1]].write(ns, [bs[2]])
        singles[keys.owners(nodes, ns, ks[3], 3)[2]].write(ns, [bs[3]])
        c.write(ns, bs[4:])
        r = c.read(ns, ks)
        assert [b.index for b in r.blocks] == [0, 1, 2]
        assert r.payloads == [b.payload for b in bs[:3]]
        assert r.partial and r.reason == "missing" and r.requested == 6
        assert c.read(ns, [b"absent!!"] + ks).blocks == []
        assert c.read(ns, []).blocks == []


def test_lookup_goes_to_the_first_owner_of_the_first_key(servers, ns):
    nodes = [s.grpc for s in servers]
    toks = [random.Random(5).randrange(0, 152064) for _ in range(12 * BS + 7)]
    with Client(nodes, timeout=30.0) as c:
        ks = c.keys_for(toks)
        assert ks == keys.chain(toks)
        w = c.write_tokens(ns, toks, [os.urandom(1000) for _ in ks])
        assert w.stored == 12
        # The servers are not a cluster: the first key's owner finds the
        # leading keys it owns itself, and stops at the first it does not.
        first = [keys.owners(nodes, ns, k)[0] for k in ks]
        run = next((i for i, n in enumerate(first) if n != first[0]), len(ks))
        assert c.lookup(ns, tokens=toks).found == run
        assert c.lookup(ns, keys=ks).found == run
        assert c.lookup(ns, tokens=toks, hash_on_server=True).keys == ks
        # A chain whose keys all belong to one node is found whole.
        same = [k for k, n in zip(ks, first) if n == first[0]]
        assert c.lookup(ns, keys=same).found == len(same)
        assert c.lookup(ns, keys=[b"absent!!"] + ks).found == 0
        assert c.lookup(ns, tokens=toks[:BS - 1]).found == 0

        hit = c.lookup(ns, keys=same, lease_ms=5_000)
        assert hit.lease_id != 0
        assert c.read(ns, same, lease_id=hit.lease_id).payloads and c.release(hit.lease_id).lease_id == hit.lease_id

        d = c.delete(ns, ks[::-1])
        assert d.deleted == 12
        assert c.read(ns, ks).blocks == []


def test_a_stopped_node_is_skipped_and_its_blocks_go_to_the_next_owner(servers, singles, ns):
    nodes = [s.grpc for s in servers]
    with Client(nodes, connections=1, timeout=10.0, down_for=60.0) as c:
        before = random_keys(60, seed=6)
        c.write(ns, blocks_of(before, seed=7))
        dead = servers[0]
        assert dead.stop() == 0
        del singles[dead.grpc]
        live = [n for n in nodes if n != dead.grpc]

        ks = random_keys(60, seed=8)
        bs = blocks_of(ks, seed=9)
        assert any(keys.owners(nodes, ns, k)[0] == dead.grpc for k in ks)
        w = c.write(ns, bs)
        assert (w.stored, w.existing) == (60, 0)
        assert c.down() == [dead.grpc]
        for k in ks:
            want = keys.owners(live, ns, k)[0]
            assert want == next(n for n in keys.rank(nodes, ns, k) if n != dead.grpc)
            assert holders(singles, ns, k) == {want}
        r = c.read(ns, ks)
        assert not r.partial and r.payloads == [b.payload for b in bs]

        # Blocks written before the stop lived only on the dead node (no
        # replication between these servers): the read ends at the first.
        lost = next(i for i, k in enumerate(before) if keys.owners(nodes, ns, k)[0] == dead.grpc)
        r = c.read(ns, before)
        assert len(r.blocks) == lost and r.reason == "missing"
        assert c.lookup(ns, keys=[before[lost]]).found == 0

        # Once its mark expires the dead node is asked again, fails, and is skipped again.
        c.down_for = 0.0
        c._router.mark(dead.grpc, answered=False)
        assert c.down() == []
        assert c.read(ns, ks).payloads == [b.payload for b in bs]
        s = c.stats()
        assert s.tier(Tier.MEMORY).blocks == sum(
            st.tier(Tier.MEMORY).blocks for st in c.node_stats().values() if not isinstance(st, KvtierError))
        assert isinstance(c.node_stats()[dead.grpc], KvtierError)


def test_no_node_answering_raises_unavailable(kvtier_bin, ns):
    with Server.start(binary=kvtier_bin) as s:
        addr = s.grpc
    with Client([addr, "127.0.0.1:9"], connections=1, timeout=5.0, retries=0) as c:
        for call in (lambda: c.write(ns, [Block(key=b"k", payload=b"v")]),
                     lambda: c.read(ns, [b"k"]),
                     lambda: c.lookup(ns, keys=[b"k"]),
                     c.stats):
            with pytest.raises(KvtierError) as ei:
                call()
            assert ei.value.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
        assert sorted(c.down()) == sorted([addr, "127.0.0.1:9"])


def test_errors_that_are_answers_are_not_failed_over(servers, ns):
    with Client([s.grpc for s in servers], timeout=10.0) as c:
        with pytest.raises(KvtierError) as ei:
            c.write("bad namespace!", [Block(key=b"k", payload=b"v")])
        assert ei.value.code.name == "INVALID_ARGUMENT"
        assert c.down() == []
        with pytest.raises(TypeError):
            c.write(ns, [b"not a block"])  # type: ignore[list-item]


def test_a_lease_taken_through_the_node_list_covers_the_read_on_a_real_cluster(kvtier_bin):
    """Three nodes as one cluster (docs/cluster.md): a lookup with a lease
    goes to one node, which grants the lease; the read that follows spans
    every node, and only the granting node may be sent the lease id (the
    others never granted it and would refuse the read)."""
    from kvtier.server import free_port_pairs

    ports = free_port_pairs(3)
    nodes = [f"127.0.0.1:{p}" for p in ports]
    members = ",".join(f"grpc://{n}" for n in nodes)
    started = [Server.start(binary=kvtier_bin, listen=n,
                            args=["--cluster-nodes", members, "--cluster-self", f"grpc://{n}"]) for n in nodes]
    try:
        ks = random_keys(24, seed=7)
        bs = blocks_of(ks, seed=7)
        with Client(nodes, connections=1, timeout=10.0) as c:
            c.write("lease/ns", bs)
            owners_of = {keys.owners(nodes, "lease/ns", k, 2)[0] for k in ks}
            assert len(owners_of) == 3, "the chain spans every node"
            found = c.lookup("lease/ns", keys=ks, lease_ms=30_000)
            assert found.found == 24 and found.lease_id
            r = c.read("lease/ns", ks, found.lease_id)
            assert [b.payload for b in r.blocks] == [b.payload for b in bs]
            c.release(found.lease_id)
    finally:
        for s in started:
            s.stop()


def test_a_node_that_shed_a_request_is_not_counted_as_down():
    """A shed request (UNAVAILABLE with a retry hint) is an answer from a node
    that is up but busy: it is not failed over (the next owner would only
    share the overload) and the node is not marked down; an UNAVAILABLE
    without a hint (a node not answering) still is."""
    import grpc

    from kvtier.routing import unreachable as _unreachable

    assert not _unreachable(KvtierError(grpc.StatusCode.UNAVAILABLE, "server overloaded", retry_after=0.2))
    assert _unreachable(KvtierError(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert _unreachable(KvtierError(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer"))


def test_a_lease_taken_by_one_client_is_read_and_released_by_another(kvtier_bin):
    """vLLM's scheduler takes the lease and a worker, another process with its
    own ClusterClient, reads and releases it: the lease travels with the node
    that granted it (``lease_node``), since the ids of other nodes' leases are
    theirs and a node refuses a read with a lease it never granted."""
    from kvtier.server import free_port_pairs

    ports = free_port_pairs(3)
    nodes = [f"127.0.0.1:{p}" for p in ports]
    members = ",".join(f"grpc://{n}" for n in nodes)
    started = [Server.start(binary=kvtier_bin, listen=n,
                            args=["--cluster-nodes", members, "--cluster-self", f"grpc://{n}"]) for n in nodes]
    try:
        ks = random_keys(24, seed=11)
        bs = blocks_of(ks, seed=11)
        with Client(nodes, connections=1, timeout=10.0) as sched, Client(nodes, connections=1, timeout=10.0) as worker:
            sched.write("lease/x", bs)
            assert len({keys.owners(nodes, "lease/x", k, 2)[0] for k in ks}) == 3, "the chain spans every node"
            found = sched.lookup("lease/x", keys=ks, lease_ms=30_000)
            assert found.found == 24 and found.lease_id and found.lease_node in nodes
            granting = worker.node(found.lease_node)
            assert granting.stats().active_leases == 1
            r = worker.read("lease/x", ks, found.lease_id, lease_node=found.lease_node)
            assert [b.payload for b in r.blocks] == [b.payload for b in bs]
            assert worker.release(found.lease_id, lease_node=found.lease_node).lease_id == found.lease_id
            assert granting.stats().active_leases == 0, "released on the node that granted it"
            with pytest.raises(ValueError, match="not one of"):
                worker.read("lease/x", ks, found.lease_id, lease_node="127.0.0.1:1")
            # lease() results carry the node too.
            first = keys.owners(nodes, "lease/x", ks[0])[0]
            pinned = sched.lease("lease/x", [k for k in ks if keys.owners(nodes, "lease/x", k)[0] == first], 30_000)
            assert pinned.lease_node == first
            assert worker.release(pinned.lease_id, lease_node=pinned.lease_node).lease_id == pinned.lease_id
        with Client(nodes[0], timeout=10.0) as single:
            assert single.lookup("lease/x", keys=ks, lease_ms=1_000).lease_node == "", "one address: no node"
    finally:
        for s in started:
            s.stop()


def test_leases_released_elsewhere_are_forgotten_once_expired(servers, ns, monkeypatch):
    """The client remembers which node granted each lease it took; leases
    another process released are never popped here, so expired ones are
    dropped once the table is full, and live ones kept."""
    import time

    from kvtier import cluster

    monkeypatch.setattr(cluster, "_LEASES_KEPT", 8, raising=False)
    ks = random_keys(1, seed=12)
    with Client([s.grpc for s in servers], timeout=10.0) as c:
        c.write(ns, blocks_of(ks, seed=12))
        live = c.lookup(ns, keys=ks, lease_ms=60_000)
        for _ in range(40):
            assert c.lookup(ns, keys=ks, lease_ms=1).lease_id
            time.sleep(0.002)
        assert len(c._leases) <= 8
        assert live.lease_id in c._leases
        assert c.read(ns, ks, live.lease_id).blocks, "the live lease still goes to its node only"
        c.release(live.lease_id)
        assert live.lease_id not in c._leases
