"""The Python client against the real kvtier binary."""
from __future__ import annotations

import os
import random
import time

import grpc
import pytest

from kvtier import Block, Client, KvtierError, Tier, keys
from kvtier._crc import crc32c
from kvtier.payloads import read_block
from kvtier.pb import v1 as pb

BS = 128
PAYLOAD = 1_200_000  # ~1.2 MB per block
SMALL_MAX_BLOCK = 1 << 20  # small_server's --max-block-size


def prompt(n_blocks: int, tail: int = 0, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 152064) for _ in range(n_blocks * BS + tail)]


def payloads(n: int) -> list[bytes]:
    return [os.urandom(PAYLOAD) for _ in range(n)]


def assert_timing(t, *, storage=False):
    assert t.total_us > 0
    assert abs(t.total_us - (t.queue_us + t.service_us)) <= 1
    assert t.elapsed_us > 0
    assert t.network_us == max(0, t.elapsed_us - t.total_us)
    if storage:
        assert t.storage_us <= t.service_us + 1


@pytest.fixture
def chain3(client, ns):
    """A 3-block chain of ~1.2 MB payloads written with write_tokens."""
    toks = prompt(3, tail=17)
    data = payloads(3)
    w = client.write_tokens(ns, toks, data)
    assert (w.stored, w.existing) == (3, 0)
    assert_timing(w.timing, storage=True)
    return toks, data


def test_write_lookup_read_chain(client, ns, chain3):
    toks, data = chain3
    ks = client.keys_for(toks)
    assert len(ks) == 3 and ks == keys.chain(toks)

    # A longer prompt sharing the 3 cached blocks: exactly those are found.
    longer = toks[: 3 * BS] + prompt(2, tail=5, seed=99)
    lk = client.lookup(ns, tokens=longer)
    assert lk.found == 3
    assert lk.tiers == [Tier.MEMORY] * 3
    assert len(lk.keys) == 5 and lk.keys[:3] == ks
    assert lk.lease_id == 0
    assert_timing(lk.timing)

    # Byte-identical read-back, in order, with the chain's parents.
    r = client.read(ns, ks)
    assert not r.partial and r.reason == "" and r.requested == 3
    assert [b.index for b in r.blocks] == [0, 1, 2]
    assert [b.key for b in r.blocks] == ks
    assert [b.parent for b in r.blocks] == [None, ks[0], ks[1]]
    assert all(b.token_count == BS for b in r.blocks)
    assert r.payloads == data
    assert_timing(r.timing, storage=True)

    # Idempotent re-write.
    w = client.write_tokens(ns, toks, data)
    assert (w.stored, w.existing) == (0, 3)


def test_read_stops_at_first_missing(client, ns, chain3):
    toks, data = chain3
    longer_keys = keys.chain(toks[: 3 * BS] + prompt(2, seed=7))
    r = client.read(ns, longer_keys)
    assert r.partial and r.reason == "missing"
    assert r.requested == 5
    assert r.payloads == data
    # A missing key in the middle stops the stream there.
    r = client.read(ns, [longer_keys[0], b"nope-not-a-key", longer_keys[1]])
    assert [b.index for b in r.blocks] == [0] and r.partial


def test_divergent_prompt_stops_at_divergence(client, ns, chain3):
    toks, _ = chain3
    for block in range(3):
        other = list(toks)
        other[block * BS + 5] += 1
        assert client.lookup(ns, tokens=other).found == block, f"diverging in block {block}"
    # Explicit keys, prefix only: a wrong first key finds nothing at all.
    ks = keys.chain(toks)
    assert client.lookup(ns, keys=[b"x" * 8] + ks[1:]).found == 0


def test_other_namespace_sees_nothing(client, ns, chain3):
    toks, _ = chain3
    assert client.lookup(ns + "-other", tokens=toks).found == 0
    assert client.read(ns + "-other", keys.chain(toks)).blocks == []


def test_checksum_mismatch_is_data_loss_and_stores_nothing(client, ns):
    ks = keys.chain(prompt(2, seed=3))
    good, bad = os.urandom(4096), os.urandom(4096)
    req = pb.WriteRequest(
        namespace=ns,
        blocks=[
            pb.Block(key=ks[0], token_count=BS, crc32c=crc32c(good), payload=good),
            pb.Block(key=ks[1], parent_key=ks[0], token_count=BS, crc32c=crc32c(bad) ^ 1, payload=bad),
        ],
    )
    with pytest.raises(grpc.RpcError) as ei:
        client.stub().Write(req, timeout=10)
    assert ei.value.code() == grpc.StatusCode.DATA_LOSS
    assert "blocks[1]" in ei.value.details()
    # Verified before storing: not even the valid first block was kept.
    assert client.lookup(ns, keys=ks).found == 0
    # The same batch with correct checksums goes through the client.
    w = client.write(ns, [Block(ks[0], good, token_count=BS), Block(ks[1], bad, parent=ks[0], token_count=BS)])
    assert w.stored == 2
    assert client.read(ns, ks).payloads == [good, bad]


def test_client_verifies_read_checksums(client):
    data = b"payload"
    ok = pb.ReadBlock(index=4, block=pb.Block(key=b"k", crc32c=crc32c(data), payload=data), tier=1)
    rb = read_block(ok)
    assert (rb.index, rb.payload, rb.tier, rb.parent) == (4, data, Tier.MEMORY, None)
    corrupt = pb.ReadBlock(index=0, block=pb.Block(key=b"k", crc32c=crc32c(data), payload=b"paylaod"))
    with pytest.raises(KvtierError) as ei:
        read_block(corrupt)
    assert ei.value.code == grpc.StatusCode.DATA_LOSS


def test_namespace_limits(client):
    with pytest.raises(KvtierError) as ei:
        client.lookup("n" * 129, keys=[b"k"])
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "128" in ei.value.message
    with pytest.raises(KvtierError) as ei:
        client.write("n" * 129, [Block(b"k", b"v")])
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(KvtierError) as ei:
        client.lookup("has space", keys=[b"k"])
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert client.lookup("n" * 128, keys=[b"k"]).found == 0  # the limit itself is fine


def test_lease_from_lookup(client, ns, chain3):
    toks, data = chain3
    before = int(time.time() * 1000)
    lk = client.lookup(ns, tokens=toks, lease_ms=60_000)
    assert lk.found == 3 and lk.lease_id != 0
    assert lk.lease_expires_unix_ms >= before + 59_000
    assert client.stats().active_leases >= 1
    # Reading under the lease works ...
    assert client.read(ns, lk.keys, lease_id=lk.lease_id).payloads == data
    # ... an unknown lease does not.
    with pytest.raises(KvtierError) as ei:
        client.read(ns, lk.keys, lease_id=lk.lease_id + 1_000_000)
    assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION
    # Released leases are unknown too.
    client.release(lk.lease_id)
    with pytest.raises(KvtierError) as ei:
        client.read(ns, lk.keys, lease_id=lk.lease_id)
    assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize("hash_name", sorted(keys.HASHES))
@pytest.mark.parametrize("block_size", [16, 128])
def test_python_keys_equal_server_keys(server, client, ns, hash_name, block_size):
    toks = prompt(3, tail=11, seed=block_size)
    want = keys.chain(toks, block_size, hash_name)
    assert len(want) == len(toks) // block_size
    # Raw LookupRequest with tokens: the server hashes them and returns its keys.
    r = client.stub().Lookup(
        pb.LookupRequest(namespace=ns, tokens=toks, block_size=block_size, hash=hash_name), timeout=10
    )
    assert list(r.keys) == want
    # The same through the client, both ways.
    with Client(server.grpc, connections=1, block_size=block_size, hash=hash_name) as c:
        assert c.lookup(ns, tokens=toks, hash_on_server=True).keys == want
        assert c.lookup(ns, tokens=toks).keys == want


def test_delete_and_stats(client, ns, chain3):
    toks, _ = chain3
    ks = keys.chain(toks)
    st = client.stats()
    mem = st.tier(Tier.MEMORY)
    assert mem is not None and mem.blocks >= 3 and mem.bytes >= 3 * PAYLOAD
    assert st.version
    assert_timing(st.timing)
    d = client.delete(ns, [ks[2]])
    assert d.deleted == 1
    assert client.lookup(ns, keys=ks).found == 2
    assert client.delete(ns, [ks[2]]).deleted == 0
    assert client.delete(ns, [ks[0]]).deleted >= 1
    assert client.lookup(ns, keys=ks).found == 0


def test_write_stream_batches(client, ns):
    ks = keys.chain(prompt(4, seed=11))
    data = [os.urandom(300_000) for _ in ks]
    blocks = [Block(k, d, parent=ks[i - 1] if i else None, token_count=BS) for i, (k, d) in enumerate(zip(ks, data))]
    w = client.write_stream(ns, blocks, batch_bytes=600_000)  # 2 batches
    assert (w.stored, w.existing) == (4, 0)
    assert client.read(ns, ks).payloads == data


def test_write_tokens_payload_count_checked(client, ns):
    with pytest.raises(ValueError, match="2 payloads for 3 full blocks"):
        client.write_tokens(ns, prompt(3, tail=100), [b"a", b"b"])


def test_lookup_argument_checks(client, ns):
    with pytest.raises(ValueError):
        client.lookup(ns)
    with pytest.raises(ValueError):
        client.lookup(ns, keys=[b"k"], tokens=[1])
    with pytest.raises(TypeError):
        client.lookup(ns, keys=b"single-key")


def test_oversized_block_rejected(small_server, ns):
    with Client(small_server.grpc, connections=1) as c:
        with pytest.raises(KvtierError) as ei:
            c.write(ns, [Block(b"big", bytes(SMALL_MAX_BLOCK + 1))])
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert c.write(ns, [Block(b"fits", bytes(SMALL_MAX_BLOCK))]).stored == 1
        assert c.lookup(ns, keys=[b"big"]).found == 0


class _Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused (fake)"


def test_retries_unavailable_then_succeeds(client, monkeypatch):
    real = client.stub
    calls = []

    class Flaky:
        def __init__(self, stub):
            self.stub = stub

        def Stats(self, req, timeout):
            calls.append(timeout)
            if len(calls) <= 2:
                raise _Unavailable()
            return self.stub.Stats(req, timeout=timeout)

    monkeypatch.setattr(client, "stub", lambda: Flaky(real()))
    st = client.stats()
    assert st.version and len(calls) == 3
    assert calls[0] >= calls[1] >= calls[2]  # one deadline across attempts


class _Shed(_Unavailable):
    """A request the server shed, with its retry hint in the trailers."""

    def __init__(self, hint):
        self.hint = hint

    def trailing_metadata(self):
        return (("grpc-retry-pushback-ms", self.hint),)


@pytest.mark.parametrize(
    "error, low, high",
    [
        (_Shed("300"), 0.300, 0.450),  # the server's hint, jittered above it
        (_Shed("86400000"), 10.0, 15.0),  # capped at MAX_PUSHBACK
        (_Shed("soon"), 0.010, 0.020),  # not a number: the client's own back-off
        (_Unavailable(), 0.010, 0.020),  # no hint: the client's own back-off
    ],
)
def test_a_retry_waits_for_the_servers_hint(client, monkeypatch, error, low, high):
    import kvtier.retry

    real = client.stub
    pauses = []
    calls = []

    class Shedding:
        def __init__(self, stub):
            self.stub = stub

        def Stats(self, req, timeout):
            calls.append(timeout)
            if len(calls) == 1:
                raise error
            return self.stub.Stats(req, timeout=timeout)

    monkeypatch.setattr(client, "stub", lambda: Shedding(real()))
    monkeypatch.setattr(client, "timeout", 60.0)
    monkeypatch.setattr(kvtier.retry.time, "sleep", pauses.append)
    assert client.stats().version
    assert len(pauses) == 1 and low <= pauses[0] <= high, pauses


def test_retry_shed_false_fails_a_shed_request_at_once(client, monkeypatch):
    """``retry_shed=False`` (the engine integrations): a request the server
    shed with a retry hint fails at once, carrying the hint; an UNAVAILABLE
    without one (a restart, a lost connection) is still retried."""
    real = client.stub
    calls = []

    class Failing:
        def __init__(self, stub, error):
            self.stub, self.error = stub, error

        def Stats(self, req, timeout):
            calls.append(timeout)
            if len(calls) == 1:
                raise self.error
            return self.stub.Stats(req, timeout=timeout)

    monkeypatch.setattr(client, "retry_shed", False)
    monkeypatch.setattr(client, "stub", lambda: Failing(real(), _Shed("200")))
    with pytest.raises(KvtierError) as ei:
        client.stats()
    assert ei.value.code == grpc.StatusCode.UNAVAILABLE
    assert ei.value.retry_after == pytest.approx(0.2)
    assert len(calls) == 1, "not retried"
    calls.clear()
    monkeypatch.setattr(client, "stub", lambda: Failing(real(), _Unavailable()))
    assert client.stats().version
    assert len(calls) == 2, "retried"


def test_gives_up_after_retries(client, monkeypatch):
    calls = []

    class Down:
        def Stats(self, req, timeout):
            calls.append(timeout)
            raise _Unavailable()

    monkeypatch.setattr(client, "stub", lambda: Down())
    with pytest.raises(KvtierError) as ei:
        client.stats()
    assert ei.value.code == grpc.StatusCode.UNAVAILABLE
    assert len(calls) == 1 + client.retries


def test_non_retryable_errors_are_not_retried(client, monkeypatch):
    real = client.stub
    calls = []
    monkeypatch.setattr(client, "stub", lambda: calls.append(1) or real())
    with pytest.raises(KvtierError):
        client.lookup("bad namespace", keys=[b"k"])
    assert len(calls) == 1


def test_unreachable_server_is_unavailable():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", connections=1, timeout=5, retries=1) as c:
        with pytest.raises(KvtierError) as ei:
            c.stats()
    assert ei.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _established_to(port: int) -> int:
    """Established TCP connections whose remote port is ``port`` (client sides only)."""
    n = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            rem_port = int(f[2].rsplit(":", 1)[1], 16)
            if rem_port == port and f[3] == "01":  # 01 = ESTABLISHED
                n += 1
    return n


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc/net/tcp")
def test_pool_uses_separate_connections(kvtier_bin):
    from kvtier import Server

    with Server.start(binary=kvtier_bin) as s:
        port = int(s.grpc.rsplit(":", 1)[1])
        with Client(s.grpc, connections=4) as c:
            for _ in range(8):  # round-robin touches every channel
                c.stats()
            assert _established_to(port) == 4
        # Two pools of one each: still separate connections.
        with Client(s.grpc, connections=1) as a, Client(s.grpc, connections=1) as b:
            a.stats()
            b.stats()
            assert _established_to(port) >= 2


def test_a_secret_salt_defeats_prewritten_blocks(server, ns):
    """The poisoning scenario: an attacker who may write the namespace
    pre-writes the chain of a prompt the victim will send. Unsalted, the
    victim's write finds the keys taken and its read returns the attacker's
    bytes; with a secret salt the victim's keys are its own."""
    toks = prompt(2, tail=3, seed=4242)
    mine, evil = payloads(2), [b"poison" * 1000, b"poison" * 1000]
    with Client(server.grpc, salt=b"") as attacker, Client(server.grpc, salt=b"") as naive, \
            Client(server.grpc, salt=b"victim-secret") as victim:
        assert attacker.write_tokens(ns, toks, evil).stored == 2
        # Unsalted victim: its write is refused (the keys hold other bytes),
        # and its read returns the poison.
        with pytest.raises(KvtierError, match="immutable"):
            naive.write_tokens(ns, toks, mine)
        got = naive.read(ns, naive.keys_for(toks)).blocks
        assert [bytes(b.payload) for b in got] == evil
        # Salted victim: different keys, its own bytes, nothing of the attacker's.
        assert not set(victim.keys_for(toks)) & set(attacker.keys_for(toks))
        assert victim.lookup(ns, tokens=toks).found == 0
        assert victim.write_tokens(ns, toks, mine).stored == 2
        got = victim.read(ns, victim.keys_for(toks)).blocks
        assert [bytes(b.payload) for b in got] == mine
        with pytest.raises(ValueError, match="salt"):
            victim.lookup(ns, tokens=toks, hash_on_server=True)
