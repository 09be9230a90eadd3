"""``Client.read(into=..., sizes=...)``: blocks read straight into the buffers
the callable names, asked for up front with the sizes the caller knows (the
LMCache plugin's and the SGLang backend's loads, notes/060), against the real
server on the same-host socket, over TCP and over gRPC. The native ``read``
(which returns new ``bytes``, copied again into the buffers) must not run:
a spy fails the test if it does."""
from __future__ import annotations

import os

import grpc
import pytest

from kvtier import Block, Client, KvtierError, dataplane, keys
from kvtier.server import Server

BLOCK = 4 << 20


def chain(n: int, seed: int, size: int = BLOCK) -> list[Block]:
    ks = keys.chain(list(range(seed, seed + n * 16)), block_size=16)
    return [Block(k, os.urandom(size), parent=ks[i - 1] if i else None, token_count=16) for i, k in enumerate(ks)]


@pytest.fixture(scope="module")
def local_server(kvtier_bin, tmp_path_factory):
    """A server with a same-host socket; ``.local`` is its path."""
    sock = tmp_path_factory.mktemp("sized") / "kvtier.sock"
    s = Server.start(binary=kvtier_bin, args=["--local-listen", str(sock), "--memory-capacity", "512MiB"])
    s.local = str(sock)  # type: ignore[attr-defined]
    yield s
    assert s.stop() == 0


@pytest.fixture
def no_bytes_reads(monkeypatch):
    """Fails any data-plane read that returns new ``bytes`` (the slow path)."""
    calls: list[int] = []

    def spy(self, namespace, keys, lease_id, timeout):
        calls.append(len(keys))
        raise AssertionError("the native read (new bytes, then a copy) ran: not read straight into the buffers")

    monkeypatch.setattr(dataplane.DataPlane, "read", spy)
    return calls


def client_for(path: str, local_server) -> Client:
    """A client of ``local_server`` on the same-host socket, the TCP data plane or gRPC."""
    if path == "same-host":
        return Client(f"unix://{local_server.local}", connections=2, timeout=30)
    return Client(local_server.grpc, connections=2, timeout=30, data_plane=path == "tcp", same_host=False)


@pytest.mark.parametrize("path", ["same-host", "tcp", "grpc"])
def test_sized_reads_land_in_the_callables_buffers(local_server, ns, no_bytes_reads, path):
    """16 blocks of 4 MiB and a missing key: ``into`` is asked once per key,
    in order, with the size given, before anything is read; each block lands
    in its buffer (the payload a view of it); the answer is the prefix."""
    blocks = chain(16, seed=1)
    with client_for(path, local_server) as c:
        pool = c.data_plane()
        assert (pool is None) == (path == "grpc"), pool
        if pool is not None:
            assert pool.copies_by_memory == (path == "same-host"), pool
        assert c.write(ns, blocks).stored == 16
        bufs = [bytearray(BLOCK) for _ in range(17)]
        asked: list[tuple[int, int]] = []

        def into(i, n):
            asked.append((i, n))
            return bufs[i]

        ks = [b.key for b in blocks] + [b"absent"]
        r = c.read(ns, ks, into=into, sizes=BLOCK)
        assert asked == [(i, BLOCK) for i in range(17)], "asked up front, once per key, also for the missing one"
        assert len(r.blocks) == 16 and r.partial and r.reason == "missing"
        for i, (b, blk) in enumerate(zip(r.blocks, blocks)):
            assert isinstance(b.payload, memoryview) and b.payload.obj is bufs[i]
            assert bufs[i] == blk.payload, i
    assert no_bytes_reads == []


@pytest.mark.parametrize("path", ["same-host", "tcp"])
def test_sized_reads_shorter_longer_none_and_scattered(local_server, ns, no_bytes_reads, path):
    """A block shorter than its size fills the front of its buffer (the
    payload says how long it is); ``None`` gets a new buffer; a list of
    buffers is filled in order; a block longer than its size is the caller's
    mistake (INVALID_ARGUMENT), as is a count of sizes that does not match."""
    short, whole = os.urandom(1_000_000), os.urandom(1_200_000)
    with client_for(path, local_server) as c:
        c.write(ns, [Block(b"short", short), Block(b"whole", whole), Block(b"parts", whole)])
        buf = bytearray(1_200_000)
        k, v = bytearray(600_000), bytearray(600_000)
        dests = {0: buf, 1: None, 2: [k, v]}
        r = c.read(ns, [b"short", b"whole", b"parts"], into=lambda i, n: dests[i], sizes=[1_200_000] * 3)
        assert len(r.blocks) == 3
        assert r.blocks[0].payload.obj is buf and bytes(r.blocks[0].payload) == short
        assert bytes(r.blocks[1].payload) == whole, "None: read into a new buffer of the size"
        assert isinstance(r.blocks[2].payload, list) and bytes(k) + bytes(v) == whole
        with pytest.raises(KvtierError) as ei:
            c.read(ns, [b"whole"], into=lambda i, n: bytearray(n), sizes=1_000_000)
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT, ei.value
        with pytest.raises(ValueError, match="2 keys but 1 sizes"):
            c.read(ns, [b"short", b"whole"], into=lambda i, n: bytearray(n), sizes=[1_200_000])
    assert no_bytes_reads == []


def test_a_clusters_read_into_reads_straight_into_the_buffers(local_server, ns, no_bytes_reads):
    """``ClusterClient.read_into`` gives each node its part with the buffers'
    sizes: read straight into them, not through new ``bytes``."""
    blocks = chain(8, seed=5, size=1_200_000)
    with Client([local_server.grpc], connections=2, timeout=30) as c:
        assert type(c).__name__ == "ClusterClient"
        c.write(ns, blocks)
        bufs = [bytearray(1_200_000) for _ in blocks]
        r = c.read_into(ns, [b.key for b in blocks], bufs)
        assert len(r.blocks) == 8 and [bytes(b) for b in bufs] == [b.payload for b in blocks]
    assert no_bytes_reads == []
