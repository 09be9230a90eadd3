"""Long reads striped over data-plane connections (docs/wire.md), as the Rust
client's ``WireClient::read`` does, since it is that code (kvtier._native):
against the real server. The rules themselves (stripe counts, joining runs
that stopped short, errors in any run) are tested in crates/kvtier-client."""
from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path

import pytest

from kvtier import Block, Client, keys
from kvtier.dataplane import MAX_STRIPES, STRIPE_MIN_BLOCKS

BS = 128
SIZE = 100_000
RUST_WIRE = Path(__file__).resolve().parents[2] / "crates/kvtier-client/src/wire/mod.rs"


def chain_blocks(n: int, seed: int, size: int = SIZE) -> list[Block]:
    ks = keys.chain(list(range(seed, seed + n * BS)))
    return [Block(k, os.urandom(size), parent=ks[i - 1] if i else None, token_count=BS) for i, k in enumerate(ks)]


def wire_reads(server) -> float:
    """``kvtier_requests_total{api="wire",op="read",code="ok"}``: one per data-plane Read request."""
    text = urllib.request.urlopen(f"http://{server.http}/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kvtier_requests_total{") and 'api="wire"' in line and 'op="read"' in line
        and 'code="ok"' in line
    )


# -- the rules ---------------------------------------------------------------


def test_the_defaults_are_the_rust_clients():
    # The tests run from a kvtier checkout: a missing Rust source is a failure, not a skip.
    assert RUST_WIRE.is_file(), f"{RUST_WIRE} is missing"
    src = RUST_WIRE.read_text()
    for name, value in (("STRIPE_MIN_BLOCKS", STRIPE_MIN_BLOCKS), ("MAX_STRIPES", MAX_STRIPES)):
        m = re.search(rf"pub const {name}: usize = (\d+);", src)
        assert m and int(m.group(1)) == value, name


def test_read_stripes_reaches_the_pool(server):
    with pytest.raises(ValueError, match="read_stripes"):
        Client(server.grpc, read_stripes=0)
    with Client(server.grpc, connections=1, data_connections=2, read_stripes=3) as c:
        pool = c.data_plane()
        assert (pool.connections, pool.max_stripes) == (2, 3)


# -- against the server ----------------------------------------------------------


@pytest.fixture
def clients(server):
    """A striping client (4 data-plane connections) and one with ``read_stripes=1``."""
    with Client(server.grpc, connections=1, data_connections=4, timeout=30) as c, \
            Client(server.grpc, connections=1, data_connections=4, timeout=30, read_stripes=1) as one:
        yield c, one


def test_a_long_read_is_striped_and_comes_back_in_order(server, clients, ns):
    c, one = clients
    blocks = chain_blocks(40, seed=1)
    c.write(ns, blocks)
    ks = [b.key for b in blocks]

    before = wire_reads(server)
    r = c.read(ns, ks)
    assert wire_reads(server) == before + 4, "40 keys over 4 connections: 4 requests of 10"
    assert r.payloads == [b.payload for b in blocks]
    assert [b.index for b in r.blocks] == list(range(40)) and [b.key for b in r.blocks] == ks
    assert [b.parent for b in r.blocks] == [None] + ks[:-1]
    assert (r.partial, r.reason, r.requested) == (False, "", 40)
    assert 0 < r.timing.total_us and r.timing.elapsed_us > 0

    before = wire_reads(server)
    assert one.read(ns, ks).payloads == r.payloads
    assert wire_reads(server) == before + 1, "read_stripes=1: one request"
    before = wire_reads(server)
    assert c.read(ns, ks[:15]).payloads == r.payloads[:15]
    assert wire_reads(server) == before + 1, "under 16 keys: one request"

    # into=: each payload lands in its own buffer, by its index in ks.
    bufs = [bytearray(SIZE + 7) for _ in ks]
    asked: list[tuple[int, int]] = []

    def into(i, n):
        asked.append((i, n))
        return bufs[i]

    r = c.read(ns, ks, into=into)
    assert sorted(asked) == [(i, SIZE) for i in range(40)]
    for i, blk in enumerate(r.blocks):
        assert blk.index == i and isinstance(blk.payload, memoryview) and blk.payload.obj is bufs[i]
        assert bytes(blk.payload) == blocks[i].payload == bytes(bufs[i][:SIZE])


@pytest.mark.parametrize("gap", [0, 9, 10, 21, 39])
def test_a_gap_cuts_the_answer_as_one_request_would(server, clients, ns, gap):
    """Stripes of 10 keys; the gap in the first, at a stripe's start, in the middle, last."""
    c, one = clients
    blocks = chain_blocks(39, seed=1000)
    c.write(ns, blocks)
    ks = [b.key for b in blocks]
    ks.insert(gap, b"absent-" + ns.encode())
    before = wire_reads(server)
    bufs = [bytearray(SIZE) for _ in ks]
    r = c.read(ns, ks, into=lambda i, n: bufs[i])
    assert wire_reads(server) == before + 4
    want = one.read(ns, ks)
    assert [b.index for b in r.blocks] == [b.index for b in want.blocks] == list(range(gap))
    assert [bytes(p) for p in r.payloads] == want.payloads == [b.payload for b in blocks[:gap]]
    assert (r.partial, r.reason, r.requested) == (want.partial, want.reason, want.requested) == (True, "missing", 40)


def test_a_striped_read_into_buffers_lands_each_block_in_its_own(server, clients, ns):
    c, _ = clients
    blocks = chain_blocks(40, seed=3000)
    c.write(ns, blocks)
    before = wire_reads(server)
    bufs = [bytearray(SIZE) for _ in range(41)]
    r = c.read_into(ns, [b.key for b in blocks] + [b"absent"], bufs)
    assert wire_reads(server) == before + 4, "4 stripes"
    assert [b.index for b in r.blocks] == list(range(40))
    assert [bytes(p) for p in r.payloads] == [b.payload for b in blocks] == [bytes(b) for b in bufs[:40]]
    assert (r.partial, r.reason, r.requested) == (True, "missing", 41)


def test_a_forked_child_stripes_on_its_own_threads(server, clients, ns):
    import multiprocessing as mp

    c, _ = clients
    blocks = chain_blocks(16, seed=5000, size=10_000)
    c.write(ns, blocks)
    ks = [b.key for b in blocks]
    assert c.read(ns, ks).payloads == [b.payload for b in blocks]  # the parent's stripe threads exist now

    def child(q):
        try:
            q.put(c.read(ns, ks, timeout=10).payloads == [b.payload for b in blocks])
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            q.put(repr(e))

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    ok = q.get(timeout=30)
    p.join(30)
    assert ok is True, ok
    assert c.read(ns, ks).payloads == [b.payload for b in blocks]
