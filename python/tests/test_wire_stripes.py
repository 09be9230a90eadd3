"""Long reads striped over data-plane connections (docs/wire.md), as the Rust
client's ``WireClient::read`` does: against the real server, and against a
pool that answers from a dict (timings, errors, concurrency)."""
from __future__ import annotations

import os
import re
import threading
import urllib.request
from pathlib import Path

import grpc
import pytest

from kvtier import Block, Client, KvtierError, keys
from kvtier._crc import crc32c
from kvtier.pb import v1 as pb
from kvtier.pb import wire as wpb
from kvtier.wire import MAX_STRIPES, STRIPE_MIN_BLOCKS, WirePool, stripe_bounds

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


def test_thresholds_are_the_rust_clients():
    # The tests run from a kvtier checkout: a missing Rust source is a failure, not a skip.
    assert RUST_WIRE.is_file(), f"{RUST_WIRE} is missing"
    src = RUST_WIRE.read_text()
    for name, value in (("STRIPE_MIN_BLOCKS", STRIPE_MIN_BLOCKS), ("MAX_STRIPES", MAX_STRIPES)):
        m = re.search(rf"pub const {name}: usize = (\d+);", src)
        assert m and int(m.group(1)) == value, name


@pytest.mark.parametrize(
    "connections, max_stripes, blocks, stripes",
    [
        (4, 8, 0, 1), (4, 8, 15, 1), (4, 8, 16, 2), (4, 8, 23, 2), (4, 8, 24, 3), (4, 8, 40, 4),
        (8, 8, 40, 5), (16, 8, 1000, 8), (16, 16, 1000, 16), (16, 1, 1000, 1), (1, 8, 1000, 1), (2, 3, 64, 2),
    ],
)
def test_stripes_for(connections, max_stripes, blocks, stripes):
    """One stripe per 8 keys, at most one per connection and at most the maximum (``WireClient::stripes_for``)."""
    assert WirePool(("127.0.0.1", 1), connections, max_stripes=max_stripes).stripes_for(blocks) == stripes


def test_stripe_bounds_are_contiguous_and_even():
    assert stripe_bounds(40, 4) == [range(0, 10), range(10, 20), range(20, 30), range(30, 40)]
    assert stripe_bounds(17, 2) == [range(0, 9), range(9, 17)]
    for n in range(16, 200):
        for k in range(1, n // STRIPE_MIN_BLOCKS + 1):
            runs = stripe_bounds(n, k)
            assert [x for r in runs for x in r] == list(range(n))
            assert max(map(len, runs)) - min(map(len, runs)) <= 1


def test_read_stripes_reaches_the_pool(server):
    with pytest.raises(ValueError, match="read_stripes"):
        Client(server.grpc, read_stripes=0)
    with Client(server.grpc, connections=1, data_connections=2, read_stripes=3) as c:
        pool = c.data_plane()
        assert (pool.connections, pool.max_stripes, pool.stripes_for(40)) == (2, 3, 2)


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
    threads = set()

    def into(i, n):
        asked.append((i, n))
        threads.add(threading.get_ident())
        return bufs[i]

    r = c.read(ns, ks, into=into)
    assert sorted(asked) == [(i, SIZE) for i in range(40)]
    assert len(threads) > 1, "the stripes ran on several threads"
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


def test_each_stripe_continues_replies_cut_for_size(server, clients, ns):
    c, _ = clients
    blocks = chain_blocks(40, seed=3000)
    c.write(ns, blocks)
    c.data_plane().max_reply = 2 * SIZE + 50_000  # two blocks per reply
    before = wire_reads(server)
    bufs = [bytearray(SIZE) for _ in blocks]
    r = c.read(ns, [b.key for b in blocks] + [b"absent"], into=lambda i, n: bufs[i])
    assert wire_reads(server) == before + 4 * 5 + 1, "4 stripes of 10 (the last of 11) in replies of 2 blocks"
    assert [b.index for b in r.blocks] == list(range(40))
    assert [bytes(p) for p in r.payloads] == [b.payload for b in blocks] == [bytes(b) for b in bufs]
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


# -- against a pool that answers from a dict -----------------------------------------


class DictPool(WirePool):
    """A data plane without a network: ``store`` maps keys to payloads; a key in
    ``fail`` raises its error once. Every reply's server timing is 100 µs total."""

    def __init__(self, store: dict[bytes, bytes], connections: int = 4):
        super().__init__(("127.0.0.1", 1), connections=connections)
        self.store = store
        self.fail: dict[bytes, Exception] = {}
        self.requests: list[list[bytes]] = []
        self.barrier: threading.Barrier | None = None
        self._mu = threading.Lock()

    def read(self, namespace, keys, lease_id, timeout, into=None):
        with self._mu:
            self.requests.append(list(keys))
        if self.barrier is not None:
            self.barrier.wait(timeout=10)
        blocks, payloads, reason = [], [], ""
        for i, k in enumerate(keys):
            with self._mu:
                err = self.fail.pop(k, None)
            if err is not None:
                raise err
            if k not in self.store:
                reason = "missing"
                break
            blocks.append(pb.ReadBlock(index=i, tier=1, block=pb.Block(key=k, crc32c=crc32c(self.store[k]))))
            payloads.append(self.store[k])
        done = pb.ReadDone(requested=len(keys), returned=len(blocks), partial=len(blocks) < len(keys),
                           reason=reason, timing=pb.ServerTiming(queue_us=1, total_us=100))
        reply = wpb.WireReadReply(blocks=blocks, payload_lengths=[len(p) for p in payloads], done=done)
        return reply, payloads


@pytest.fixture
def dict_client():
    ks = [b"k%02d" % i for i in range(40)]
    pool = DictPool({k: b"v" + k for k in ks})
    c = Client("127.0.0.1:1", connections=1, timeout=10, retries=1)
    c._wire, c._wire_known = pool, True
    yield c, pool, ks
    c.close()


def test_stripes_are_in_flight_together_and_timings_add_up(dict_client):
    c, pool, ks = dict_client
    pool.barrier = threading.Barrier(4)  # passes only when all four requests are waiting at once
    r = c.read("ns", ks)
    assert sorted(pool.requests) == [ks[0:10], ks[10:20], ks[20:30], ks[30:40]]
    assert [b.payload for b in r.blocks] == [b"v" + k for k in ks]
    assert (r.timing.total_us, r.timing.queue_us) == (400, 4)


def test_stripes_after_a_short_one_are_dropped_errors_included(dict_client):
    """As in Rust: runs are joined up to the first that stopped short; what
    later runs did (blocks, timings, errors) does not count."""
    c, pool, ks = dict_client
    del pool.store[ks[21]]
    pool.fail[ks[35]] = KvtierError(grpc.StatusCode.DATA_LOSS, "bad block past the gap")
    r = c.read("ns", ks)
    assert [b.index for b in r.blocks] == list(range(21))
    assert (r.partial, r.reason, r.timing.total_us) == (True, "missing", 300)


def test_an_error_in_any_stripe_fails_the_read(dict_client):
    c, pool, ks = dict_client
    pool.fail[ks[15]] = KvtierError(grpc.StatusCode.DATA_LOSS, "bad block")
    with pytest.raises(KvtierError) as ei:
        c.read("ns", ks)
    assert ei.value.code == grpc.StatusCode.DATA_LOSS and len(pool.requests) == 4, "not retried"


def test_unavailable_in_one_stripe_retries_the_whole_read(dict_client):
    c, pool, ks = dict_client
    pool.fail[ks[35]] = KvtierError(grpc.StatusCode.UNAVAILABLE, "connection reset")
    r = c.read("ns", ks)
    assert len(r.blocks) == 40 and not r.partial
    assert len(pool.requests) == 8, "all four stripes again"
    assert r.timing.total_us == 400, "the successful attempt's timings"
