"""The Python client's data plane, the Rust client core (kvtier._native), over
TCP and the same-host socket against the real server: transport choice,
results equal to gRPC's, caller buffers, forks, restarts. Against misbehaving
peers: test_dataplane_peers.py."""
from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

import kvtier
from kvtier import Block, Client, KvtierError, discovery, keys
from kvtier.dataplane import parse_addr
from kvtier.server import Server

BS = 128
PAYLOAD = 1_200_000


def chain_blocks(n: int, seed: int = 1, size: int = PAYLOAD) -> list[Block]:
    ks = keys.chain(list(range(seed, seed + n * BS)))
    return [
        Block(k, os.urandom(size), parent=ks[i - 1] if i else None, token_count=BS) for i, k in enumerate(ks)
    ]


def wire_requests(server, op: str) -> float:
    """``kvtier_requests_total{api="wire",op=op,code="ok"}`` from /metrics."""
    text = urllib.request.urlopen(f"http://{server.http}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("kvtier_requests_total{") and 'api="wire"' in line and f'op="{op}"' in line:
            if 'code="ok"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_read_and_write_go_over_the_data_plane(server, client, ns):
    pool = client.data_plane()
    assert pool is not None and pool.transport == "tcp"
    assert pool.target.endswith(f":{parse_addr(client.stats().data_listen)[1]}")
    reads, writes = wire_requests(server, "read"), wire_requests(server, "write")
    blocks = chain_blocks(3)
    w = client.write(ns, blocks)
    assert (w.stored, w.existing) == (3, 0)
    assert w.timing.total_us > 0 and w.timing.elapsed_us >= w.timing.total_us
    r = client.read(ns, [b.key for b in blocks])
    assert r.payloads == [b.payload for b in blocks]
    assert [b.parent for b in r.blocks] == [None, blocks[0].key, blocks[1].key]
    assert [b.index for b in r.blocks] == [0, 1, 2]
    assert not r.partial and r.timing.total_us > 0
    assert wire_requests(server, "write") == writes + 1
    assert wire_requests(server, "read") == reads + 1
    # Idempotent re-write.
    assert client.write(ns, blocks[:1]).existing == 1


def test_data_plane_and_grpc_see_the_same_blocks(server, ns):
    blocks = chain_blocks(2, seed=7, size=100_000)
    with Client(server.grpc, connections=1, data_plane=False) as g, Client(server.grpc, connections=1) as d:
        assert g.data_plane() is None and d.data_plane() is not None
        g.write(ns, blocks[:1])
        d.write(ns, blocks[1:])
        ks = [b.key for b in blocks]
        assert g.read(ns, ks).payloads == d.read(ns, ks).payloads == [b.payload for b in blocks]


def test_partial_read_and_empty_payloads(client, ns):
    blocks = chain_blocks(2, seed=11, size=0)
    assert client.write(ns, blocks).stored == 2
    r = client.read(ns, [blocks[0].key, b"missing", blocks[1].key])
    assert r.payloads == [b""] and r.partial and r.reason == "missing" and r.requested == 3
    assert client.read(ns, [b"missing"]).blocks == []


def test_server_errors_keep_their_status(client, ns):
    with pytest.raises(KvtierError) as ei:
        client.read("bad namespace", [b"k"])
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    # A block that is its own parent: refused, nothing of the batch stored.
    good = os.urandom(4096)
    ks = keys.chain(list(range(BS * 2)))
    with pytest.raises(KvtierError) as ei:
        client.write(ns, [Block(ks[0], good, token_count=BS), Block(ks[1], good, parent=ks[1], token_count=BS)])
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "blocks[1]" in ei.value.message
    assert client.lookup(ns, keys=ks).found == 0
    # The pool keeps working afterwards.
    assert client.write(ns, [Block(ks[0], good, token_count=BS)]).stored == 1


def test_a_block_larger_than_a_request_is_refused_before_sending(client, ns, tmp_path):
    f = tmp_path / "sparse"
    with open(f, "wb") as fh:
        fh.truncate((1 << 32) + 1)  # sparse: no disk, no memory
    with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as big:
        t0 = time.monotonic()
        with pytest.raises(KvtierError) as ei:
            client.write(ns, [Block(b"k", big)])
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "server.max_message_size" in ei.value.message
    assert time.monotonic() - t0 < 5, "refused without sending (or checksumming) 4 GiB"


def test_concurrent_callers_share_the_pool(server, ns):
    with Client(server.grpc, connections=2, data_connections=3) as c:
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                blocks = chain_blocks(2, seed=1000 * i, size=200_000)
                for _ in range(5):
                    c.write(ns, blocks)
                    assert c.read(ns, [b.key for b in blocks]).payloads == [b.payload for b in blocks]
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors


def test_data_plane_off_makes_no_discovery_call(server, monkeypatch):
    with Client(server.grpc, connections=1, data_plane=False) as c:
        monkeypatch.setattr(c, "stats", lambda: pytest.fail("discovery must not run"))
        assert c.data_plane() is None


def test_an_unreachable_data_plane_falls_back_to_grpc(server, ns, monkeypatch, caplog):
    # The advertised data plane cannot be dialled from here (a container that
    # publishes only the gRPC port): a port nothing listens on.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setattr(discovery, "data_plane_addr", lambda target, advertised: ("127.0.0.1", dead))
    blocks = chain_blocks(2, seed=11, size=10_000)
    with caplog.at_level("WARNING", logger="kvtier"), Client(server.grpc, connections=1, timeout=5) as c:
        assert c.data_plane() is None
        assert c.write(ns, blocks).stored == 2
        assert c.read(ns, [b.key for b in blocks]).payloads == [b.payload for b in blocks]
    assert f"127.0.0.1:{dead}" in caplog.text and "transport: gRPC" in caplog.text, caplog.text


def test_discovery_failure_propagates():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"127.0.0.1:{port}", connections=1, timeout=3, retries=0) as c:
        with pytest.raises(KvtierError) as ei:
            c.read("ns", [b"k"])
        assert ei.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert not c._wire.known  # tried again next time


def _fork_read(c: Client, ns: str, key: bytes, size: int, q) -> None:
    try:
        buf = bytearray(size)
        r = c.read_into(ns, [key], [buf])
        q.put((len(r.blocks), bytes(buf)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put((repr(e), None))


@pytest.mark.parametrize("local", [False, True], ids=["tcp", "same-host"])
def test_a_forked_child_gets_its_own_connections(local_server, ns, local):
    """Engines fork workers: a child's reads use its own connections (on the
    same-host socket the server copies into the child, not into the parent),
    and the parent's connections keep working after the child has gone."""
    blocks = chain_blocks(1, seed=21, size=300_000)
    with Client(f"unix://{local_server.local}" if local else local_server.grpc, connections=1) as c:
        c.write(ns, blocks)
        parent_buf = bytearray(300_000)
        assert len(c.read_into(ns, [blocks[0].key], [parent_buf]).blocks) == 1
        parent_buf[:] = bytes(300_000)
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_fork_read, args=(c, ns, blocks[0].key, 300_000, q))
        p.start()
        n, got = q.get(timeout=60)
        p.join(30)
        assert n == 1 and got == blocks[0].payload, n
        assert parent_buf == bytes(300_000), "nothing was copied into the parent"
        # The parent's connection was not disturbed by the child.
        assert c.read(ns, [blocks[0].key]).payloads == [blocks[0].payload]


def test_pool_writes_any_contiguous_buffer_by_its_byte_length(client, ns):
    import array

    values = array.array("H", range(5000))  # 2-byte items: 5,000 items, 10,000 bytes
    raw = values.tobytes()
    w = client.write(ns, [Block(b"typed", values)])
    assert w.stored == 1
    assert client.read(ns, [b"typed"]).payloads == [raw]


@pytest.mark.parametrize("data_plane", [True, False], ids=["data-plane", "grpc"])
def test_read_into_caller_buffers(server, ns, data_plane):
    """``read(into=...)`` lands each payload in the caller's buffer (received
    straight into it over the data plane), continued replies included;
    ``None`` from the callback keeps a new bytes object."""
    with Client(server.grpc, connections=1, data_plane=data_plane) as c:
        blocks = chain_blocks(5, seed=91, size=300_000)
        c.write(ns, blocks)
        bufs = {i: bytearray(400_000) for i in (0, 2, 3, 4)}  # block 1: default
        asked = []

        def into(i, n):
            asked.append((i, n))
            return bufs.get(i)

        r = c.read(ns, [b.key for b in blocks], into=into)
        assert sorted(asked) == [(i, 300_000) for i in range(5)]
        assert r.payloads == [b.payload for b in blocks]
        for i, blk in enumerate(r.blocks):
            if i in bufs:
                assert isinstance(blk.payload, memoryview) and blk.payload.obj is bufs[i]
                assert bytes(bufs[i][:300_000]) == blocks[i].payload
            else:
                assert isinstance(blk.payload, bytes)
        with pytest.raises(KvtierError, match="need 300000"):
            c.read(ns, [blocks[0].key], into=lambda i, n: bytearray(10))


@pytest.mark.parametrize("data_plane", [True, False], ids=["data-plane", "grpc"])
def test_gather_writes_and_scatter_reads(server, ns, data_plane):
    """A payload given as parts (K and V pages apart in memory) is written
    as one block and read back into separate parts, checksummed end to end."""
    k = bytearray(os.urandom(70_000))
    v = bytearray(os.urandom(50_000))
    with Client(server.grpc, connections=1, data_plane=data_plane) as c:
        c.write(ns, [Block(key=b"page", payload=[memoryview(k), v])])
        whole = c.read(ns, [b"page"])
        assert whole.payloads == [bytes(k) + bytes(v)]
        k2, v2 = bytearray(70_000), bytearray(60_000)
        r = c.read(ns, [b"page"], into=lambda i, n: [k2, v2])
        parts = r.blocks[0].payload
        assert isinstance(parts, list) and [bytes(p) for p in parts] == [bytes(k), bytes(v)]
        assert k2 == k and v2[:50_000] == v
        with pytest.raises(KvtierError, match="need 120000"):
            c.read(ns, [b"page"], into=lambda i, n: [bytearray(10), bytearray(10)])


def test_tokens_reach_grpc_and_the_data_plane(kvtier_bin, tmp_path, ns):
    """With authentication on, the Python client authenticates every gRPC call
    and every data-plane connection with its token; a token for another
    namespace is refused with PERMISSION_DENIED, no token with UNAUTHENTICATED."""
    from kvtier.server import Server

    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[tokens]]\ntoken = "python-token-aaaaaaaa"\nnamespaces = ["py/"]\naccess = "read-write"\n'
        '[[tokens]]\ntoken = "python-token-bbbbbbbb"\nnamespaces = ["other/"]\naccess = "read-write"\n'
    )
    with Server.start(binary=kvtier_bin, args=["--auth-tokens", str(tokens)]) as s:
        blocks = chain_blocks(2, seed=5, size=100_000)
        with Client(s.grpc, connections=1, token="python-token-aaaaaaaa") as c:
            assert c.write("py/" + ns, blocks).stored == 2
            assert c.data_plane() is not None
            assert c.read("py/" + ns, [b.key for b in blocks]).payloads == [b.payload for b in blocks]
        with Client(s.grpc, connections=1, token="python-token-bbbbbbbb") as other:
            with pytest.raises(KvtierError) as ei:
                other.read("py/" + ns, [blocks[0].key])
            assert ei.value.code == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(KvtierError) as ei:
                other.lookup("py/" + ns, keys=[blocks[0].key])
            assert ei.value.code == grpc.StatusCode.PERMISSION_DENIED
        with Client(s.grpc, connections=1, token="") as anon:
            with pytest.raises(KvtierError) as ei:
                anon.lookup("py/" + ns, keys=[blocks[0].key])
            assert ei.value.code == grpc.StatusCode.UNAUTHENTICATED


# -- the same-host socket (docs/local.md) --------------------------------------


@pytest.fixture(scope="module")
def local_server(kvtier_bin, tmp_path_factory):
    """A server with a same-host socket; ``.local`` is its path."""
    sock = tmp_path_factory.mktemp("local") / "kvtier.sock"
    s = Server.start(binary=kvtier_bin, args=["--local-listen", str(sock), "--memory-capacity", "1GiB"])
    s.local = str(sock)  # type: ignore[attr-defined]
    yield s
    assert s.stop() == 0


def test_the_same_host_socket_moves_blocks_by_memory(local_server, ns, caplog):
    blocks = chain_blocks(16, seed=3, size=4 << 20)
    with caplog.at_level("INFO", logger="kvtier"), Client(f"unix://{local_server.local}", connections=2) as c:
        pool = c.data_plane()
        assert pool is not None and pool.transport == "unix" and pool.copies_by_memory
        assert c.write(ns, blocks).stored == 16
        bufs = [bytearray((4 << 20) + 1) for _ in range(17)]
        r = c.read_into(ns, [b.key for b in blocks] + [b"absent-key"], bufs)
        assert (len(r.blocks), r.partial, r.reason) == (16, True, "missing")
        for b, blk in zip(r.blocks, blocks):
            assert b.payload.obj is bufs[b.index] and b.payload == blk.payload
        # Lookups go through the same socket (gRPC on it).
        assert c.lookup(ns, keys=[b.key for b in blocks]).found == 16
    assert "same-host socket" in caplog.text and "through shared memory" in caplog.text, caplog.text


def test_map_read_leaves_blocks_in_shared_memory_until_release(local_server, ns):
    """``map_read`` gives each block's address in kvtier's shared memory (what
    a GPU engine DMAs from): the bytes there are the block's, inside the
    segments it lists, until release; elsewhere it is refused."""
    import ctypes

    blocks = chain_blocks(8, seed=11, size=4 << 20)
    with Client(f"unix://{local_server.local}", connections=2) as c:
        assert c.write(ns, blocks).stored == 8
        with c.map_read(ns, [b.key for b in blocks] + [b"absent-key"]) as m:
            assert (len(m.blocks), m.partial, m.reason) == (8, True, "missing")
            segs = m.segments
            for (addr, n), blk in zip(m.regions, blocks):
                assert n == len(blk.payload)
                assert ctypes.string_at(addr, n) == blk.payload
                assert any(a <= addr and addr + n <= a + length for _, a, length in segs), "a region outside"
            buf = bytearray(4 << 20)
            assert m.copy_into(3, buf) == 4 << 20 and buf == blocks[3].payload
            with pytest.raises(IndexError):
                m.copy_into(8, buf)  # past the last block found: an error, not a crash
        with pytest.raises(Exception, match="released"):
            _ = m.regions
        # The connection went back to the pool: reads go on.
        assert c.read(ns, [blocks[0].key]).payloads == [blocks[0].payload]
    with Client(local_server.grpc, connections=1, same_host=False) as c, pytest.raises(KvtierError) as e:
        c.map_read(ns, [blocks[0].key])
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_a_client_given_the_tcp_address_upgrades_to_the_socket(local_server, ns, caplog):
    with caplog.at_level("INFO", logger="kvtier"), Client(local_server.grpc, connections=1) as c:
        pool = c.data_plane()
        assert pool is not None and pool.transport == "unix", pool
        blocks = chain_blocks(2, seed=8, size=1 << 20)
        c.write(ns, blocks)
        assert c.read(ns, [b.key for b in blocks]).payloads == [b.payload for b in blocks]
    assert f"advertised by {local_server.grpc}" in caplog.text, caplog.text


@pytest.mark.parametrize("path", ["same-host", "tcp"])
def test_read_into_parts_lands_each_block_in_its_layers(server, local_server, ns, path):
    """A block given as one region per layer (how an engine's KV cache keeps
    its layers apart) lands in those regions in order, with no staging buffer:
    by memory on the same-host socket, received into them over TCP. 16 blocks
    of 4 MiB, each split over 16 layers; one more block over 2,000 regions
    (more than one system call takes); regions too small are refused."""
    target = f"unix://{local_server.local}" if path == "same-host" else server.grpc
    layers, per = 16, 256 << 10
    blocks = chain_blocks(16, seed=12, size=layers * per)
    cache = [bytearray(len(blocks) * per) for _ in range(layers)]
    with Client(target, connections=2) as c:
        pool = c.data_plane()
        assert pool is not None and pool.copies_by_memory == (path == "same-host"), pool
        assert c.write(ns, blocks).stored == len(blocks)
        parts = [[memoryview(cache[layer])[b * per:(b + 1) * per] for layer in range(layers)]
                 for b in range(len(blocks))]
        r = c.read_into(ns, [b.key for b in blocks], parts)
        assert len(r.blocks) == len(blocks) and not r.partial
        for b, blk in enumerate(blocks):
            for layer in range(layers):
                assert cache[layer][b * per:(b + 1) * per] == blk.payload[layer * per:(layer + 1) * per], (b, layer)
        assert [sum(len(p) for p in b.payload) for b in r.blocks] == [layers * per] * len(blocks)
        # Many small regions, the last one larger than what is left.
        one = chain_blocks(1, seed=13, size=1 << 20)[0]
        c.write(ns, [one])
        small = [bytearray(524) for _ in range(2_000)] + [bytearray(100_000)]
        assert len(c.read_into(ns, [one.key], [small]).blocks) == 1
        assert b"".join(small)[:1 << 20] == one.payload
        # Empty regions take nothing, however many come first.
        whole = bytearray(1 << 20)
        assert len(c.read_into(ns, [one.key], [[bytearray(0)] * 1_100 + [whole]]).blocks) == 1
        assert whole == one.payload
        with pytest.raises(KvtierError) as ei:
            c.read_into(ns, [one.key], [[bytearray(1 << 19), bytearray((1 << 19) - 1)]])
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT, ei.value


def test_a_small_buffer_is_the_callers_error(local_server, ns):
    with Client(f"unix://{local_server.local}", connections=1) as c:
        blocks = chain_blocks(1, seed=4, size=100_000)
        c.write(ns, blocks)
        with pytest.raises(KvtierError) as ei:
            c.read_into(ns, [blocks[0].key], [bytearray(99_999)])
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT, ei.value
        with pytest.raises(ValueError, match="read-only"):
            c.read_into(ns, [blocks[0].key], [b"read-only"])


def test_a_restarted_server_means_errors_then_a_reconnect_never_a_hang(kvtier_bin, tmp_path, ns):
    sock = tmp_path / "kvtier.sock"
    args = ["--local-listen", str(sock)]
    s = Server.start(binary=kvtier_bin, args=args)
    blocks = chain_blocks(1, seed=6, size=200_000)
    with Client(f"unix://{sock}", connections=1, timeout=3, retries=1) as c:
        c.write(ns, blocks)
        os.kill(s.pid, signal.SIGKILL)
        s.stop()
        t0 = time.monotonic()
        with pytest.raises(KvtierError) as ei:
            c.read_into(ns, [blocks[0].key], [bytearray(200_000)])
        assert ei.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert time.monotonic() - t0 < 5, "failed within the deadline"
        s2 = Server.start(binary=kvtier_bin, args=args)  # a fresh, empty server on the same path
        try:
            buf = bytearray(200_000)
            assert c.read_into(ns, [blocks[0].key], [buf]).blocks == [], "a miss, on a fresh connection"
            assert c.write(ns, blocks).stored == 1
            assert len(c.read_into(ns, [blocks[0].key], [buf]).blocks) == 1 and buf == blocks[0].payload
        finally:
            s2.stop()


def _metric(server, name: str) -> float:
    text = urllib.request.urlopen(f"http://{server.http}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


_DYING_READER = """
import sys
from kvtier import Client
sock, ns, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
keys = [bytes.fromhex(k) for k in sys.stdin.read().split()]
with Client("unix://" + sock, connections=8) as c:
    hit = c.lookup(ns, keys=keys, lease_ms=1500)
    bufs = [bytearray(4 << 20) for _ in keys]
    print("reading", flush=True)
    while True:
        c.read_into(ns, keys, bufs, lease_id=hit.lease_id)
"""


def test_a_client_that_dies_mid_read_leaks_nothing(local_server, ns, tmp_path):
    """A reader SIGKILLed while the server copies into it: the copies fail
    (ESRCH), its requests end, its lease's pins go at the lease's expiry, and
    the server serves the next client as before."""
    import subprocess
    import sys

    blocks = chain_blocks(32, seed=77, size=4 << 20)
    with Client(f"unix://{local_server.local}", connections=4) as c:
        c.write(ns, blocks)
        script = tmp_path / "reader.py"
        script.write_text(_DYING_READER)
        p = subprocess.Popen([sys.executable, str(script), local_server.local, ns, str(len(blocks))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(kvtier.__file__).parents[1])})
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(" ".join(b.key.hex() for b in blocks))
        p.stdin.close()
        assert p.stdout.readline().strip() == "reading"
        # Killed while the server is copying into it (a request in flight).
        end = time.monotonic() + 10
        while _metric(local_server, "kvtier_inflight_requests") == 0 and time.monotonic() < end:
            pass
        p.kill()
        p.wait(10)
        # Its requests end and its lease's pins go (lease_ms=1500).
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if _metric(local_server, "kvtier_inflight_requests") == 0 and \
                    _metric(local_server, "kvtier_lease_pinned_bytes") == 0:
                break
            time.sleep(0.1)
        assert _metric(local_server, "kvtier_inflight_requests") == 0
        assert _metric(local_server, "kvtier_lease_pinned_bytes") == 0
        # And the next client is served, bytes intact.
        bufs = [bytearray(4 << 20) for _ in blocks]
        r = c.read_into(ns, [b.key for b in blocks], bufs)
        assert len(r.blocks) == 32 and all(bytes(bufs[i]) == b.payload for i, b in enumerate(blocks))
