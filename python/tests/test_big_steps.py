"""An engine step larger than the server's message limit (a 512 MiB step of
32 x 16 MiB blocks against the default 256 MiB ``server.max_message_size``)
is stored and read back whole on both of ``kvtier.Client``'s paths: the
native core's data plane, and the gRPC fallback of a Python without
``kvtier._native``, which cuts writes to the advertised limit as the native
core does (``kvtier.split``)."""
from __future__ import annotations

import os
import urllib.request

import grpc
import pytest

from kvtier import Block, Client, KvtierError, dataplane, keys, split
from kvtier.server import Server

MIB = 1 << 20
BLOCK = 16 * MIB
BLOCKS = 32
LIMIT = 256 * MIB  # the server's default server.max_message_size


@pytest.fixture(scope="module")
def big_server(kvtier_bin):
    """A server of its own: room for one step at a time (each test deletes its own)."""
    s = Server.start(binary=kvtier_bin, args=["--memory-capacity", "1GiB"])
    yield s
    assert s.stop() == 0


@pytest.fixture(params=["native", "fallback"])
def path(request, monkeypatch) -> str:
    """Which path ``Client`` takes: the native core, or gRPC as without it."""
    if request.param == "fallback":
        monkeypatch.setattr(dataplane, "_native", None)
        monkeypatch.setattr(dataplane, "_MISSING", ImportError("kvtier._native hidden by the test"))
    else:
        assert dataplane.available(), dataplane.why_unavailable()
    return str(request.param)


def grpc_writes(server) -> float:
    """``kvtier_requests_total{api="v1",op="write",code="ok"}`` from /metrics."""
    text = urllib.request.urlopen(f"http://{server.http}/metrics", timeout=10).read().decode()
    want = 'kvtier_requests_total{api="v1",op="write",code="ok"} '
    return sum(float(line[len(want):]) for line in text.splitlines() if line.startswith(want))


def payload(base: bytes, i: int) -> bytes:
    """Block ``i``: ``base`` turned by a different amount for each block."""
    at = (i * 4099 + 1) % len(base)
    return base[at:] + base[:at]


def test_a_step_over_the_message_limit_is_stored_and_read_back(big_server, path):
    ns = f"big-{path}-{os.getpid()}"
    base = os.urandom(BLOCK)
    ks = keys.chain(list(range(BLOCKS * 16)), block_size=16)
    blocks = [Block(k, payload(base, i), parent=ks[i - 1] if i else None, token_count=16)
              for i, k in enumerate(ks)]
    assert sum(len(b.payload) for b in blocks) == 512 * MIB > LIMIT
    before = grpc_writes(big_server)
    with Client(big_server.grpc, connections=2, timeout=120.0) as c:
        assert (c.data_plane() is None) == (path == "fallback")
        assert c.stats().max_message_size == LIMIT
        w = c.write(ns, blocks)
        assert (w.stored, w.existing) == (BLOCKS, 0)
        assert w.timing.total_us > 0 and w.timing.elapsed_us >= w.timing.total_us
    del blocks, w
    if path == "fallback":
        assert grpc_writes(big_server) - before == 3, "cut into runs of 15, 15 and 2 blocks"
    try:
        # Read back by fresh clients, as a fresh engine would: into its
        # buffers, and as new bytes; both replies are over the limit.
        with Client(big_server.grpc, connections=2, timeout=120.0) as c:
            buf = bytearray(BLOCKS * BLOCK)
            view = memoryview(buf)
            r = c.read_into(ns, ks, [view[i * BLOCK:(i + 1) * BLOCK] for i in range(BLOCKS)])
            assert (len(r.blocks), r.partial) == (BLOCKS, False)
            for i in range(BLOCKS):
                assert view[i * BLOCK:(i + 1) * BLOCK] == payload(base, i), f"block {i}"
            del r, view, buf
        with Client(big_server.grpc, connections=2, timeout=120.0) as c:
            r = c.read(ns, ks)
            assert (len(r.blocks), r.partial) == (BLOCKS, False)
            for i, b in enumerate(r.blocks):
                assert b.payload == payload(base, i), f"block {i}"
    finally:
        with Client(big_server.grpc, connections=1, data_plane=False) as c:
            c.delete(ns, ks[:1])  # the chain's descendants go with it


def test_runs_fit_the_limit_and_a_block_over_it_is_refused():
    def blk(n: int) -> Block:
        return Block(b"k" * 32, b"\0" * n)

    each = 100 + split.BLOCK_OVERHEAD
    assert [len(r) for r in split.runs([blk(100)] * 5, 2 * each)] == [2, 2, 1]
    assert [len(r) for r in split.runs([blk(100)] * 5, 2 * each - 1)] == [1] * 5
    assert [len(r) for r in split.runs([Block(b"k" * 32, [b"\0" * 50] * 2)] * 3, 3 * each)] == [3]
    assert split.runs([], 10) == []
    with pytest.raises(KvtierError) as e:
        split.runs([blk(1), blk(each)], each)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "block 1 is" in str(e.value) and "server.max_message_size" in str(e.value)
