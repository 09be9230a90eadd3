"""The seed service's wire API (kvstore.KVStoreService) exercised by a client
generated straight from the contract with grpcio-tools, independent of the
kvtier SDK: what an existing client of the seed service would do."""
from __future__ import annotations

import importlib
import struct
import sys
from pathlib import Path

import grpc
import pytest
import xxhash
from grpc_tools import protoc

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    out = tmp_path_factory.mktemp("kvstore_stubs")
    rc = protoc.main([
        "protoc", f"-I{REPO / 'proto'}", f"--python_out={out}", f"--grpc_python_out={out}",
        str(REPO / "proto" / "kvstore" / "kvstore.proto"),
    ])
    assert rc == 0
    sys.path.insert(0, str(out))
    try:
        pb = importlib.import_module("kvstore.kvstore_pb2")
        pbg = importlib.import_module("kvstore.kvstore_pb2_grpc")
    finally:
        sys.path.remove(str(out))
    return pb, pbg


@pytest.fixture
def stub(server, stubs):
    pb, pbg = stubs
    ch = grpc.insecure_channel(server.grpc, options=[
        ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
    yield pb, pbg.KVStoreServiceStub(ch)
    ch.close()


def chunk_hashes(tokens, bs=128):
    out, prev = [], 0
    for i in range(0, len(tokens) - bs + 1, bs):
        prev = xxhash.xxh3_64_intdigest(struct.pack("<Q", prev) + struct.pack(f"<{bs}q", *tokens[i:i + bs]))
        out.append(prev)
    return out


def write_chain(pb, stub, tenant, tokens, payloads, first_parent=0, skip=0):
    hashes = chunk_hashes(tokens)
    for i, h in enumerate(hashes):
        if i < skip:
            continue
        chunk = pb.PromptChunk(hash=h, parent_hash=hashes[i - 1] if i else first_parent,
                               buffer=payloads[i], tokens=tokens[i * 128:(i + 1) * 128], partition_key="pk")
        r = stub.Write(pb.WriteRequest(resource_name=tenant[0], container_name=tenant[1], chunk=chunk))
        assert r.success, r.error
        m = r.server_metrics
        assert 0 <= m.storage_latency_us <= m.total_latency_us
        assert m.overhead_us == m.total_latency_us - m.storage_latency_us
    return hashes


def lookup(pb, stub, tenant, tokens):
    r = stub.Lookup(pb.LookupRequest(resource_name=tenant[0], container_name=tenant[1], tokens=tokens))
    assert r.success, r.error
    assert 0 <= r.server_metrics.storage_latency_us <= r.server_metrics.total_latency_us
    return r


def test_conversation_versions_streaming_and_errors(stub):
    pb, s = stub
    tenant = ("pyacct", "kvcache")
    toks = [t * 7 + 3 for t in range(128 * 3)]
    payloads = [bytes([i]) * 1_200_000 for i in range(3)]
    hashes = write_chain(pb, s, tenant, toks, payloads)

    # Longer prompt: 3 cached, last hash right, each location readable byte-identical.
    r = lookup(pb, s, tenant, toks + list(range(1000, 1200)))
    assert r.cached_blocks == 3
    assert r.last_hash == hashes[-1]
    assert [loc.hash for loc in r.locations] == hashes
    for i, loc in enumerate(r.locations):
        rr = s.Read(pb.ReadRequest(resource_name=tenant[0], container_name=tenant[1], location=loc.location))
        assert rr.found and rr.success
        assert rr.chunk.buffer == payloads[i]
        assert list(rr.chunk.tokens) == toks[i * 128:(i + 1) * 128]
        assert rr.chunk.parent_hash == (hashes[i - 1] if i else 0)
        assert 0 <= rr.server_metrics.storage_latency_us <= rr.server_metrics.total_latency_us

    # Divergent prompt: stops at the divergence.
    div = list(toks)
    div[300] = -5
    assert lookup(pb, s, tenant, div).cached_blocks == 2

    # A colliding block (same tokens as block 2, other parent): both versions resolve.
    alt = list(toks)
    alt[128:256] = [t + 50_000 for t in alt[128:256]]
    alt_payloads = [b"", b"alt1" * 100, b"alt2" * 100]
    alt_hashes = write_chain(pb, s, tenant, alt, alt_payloads, skip=1)
    ra, ro = lookup(pb, s, tenant, alt), lookup(pb, s, tenant, toks)
    assert ra.cached_blocks == 3 and ra.last_hash == alt_hashes[2]
    assert ro.cached_blocks == 3 and ro.last_hash == hashes[2]

    def read(loc):
        return s.Read(pb.ReadRequest(resource_name=tenant[0], container_name=tenant[1], location=loc))

    assert read(ra.locations[2].location).chunk.buffer == alt_payloads[2]
    assert read(ro.locations[2].location).chunk.buffer == payloads[2]

    # StreamingRead of all locations answers in order; an unknown location is found=false.
    locs = [loc.location for loc in r.locations] + ["44" * 25]
    reqs = (pb.ReadRequest(resource_name=tenant[0], container_name=tenant[1], location=location) for location in locs)
    out = list(s.StreamingRead(reqs))
    assert [o.chunk.buffer for o in out[:3]] == payloads
    assert not out[3].found and not out[3].success and "not found" in out[3].error

    # Malformed requests: in-band errors, gRPC status OK.
    bad = s.Read(pb.ReadRequest(resource_name=tenant[0], container_name=tenant[1], location="garbage"))
    assert not bad.success and not bad.found and bad.error
    w = s.Write(pb.WriteRequest(resource_name=tenant[0], container_name=tenant[1],
                                chunk=pb.PromptChunk(tokens=[1, 2, 3], buffer=b"x")))
    assert not w.success and "128" in w.error


def test_tenants_never_see_each_other(stub):
    pb, s = stub
    toks = list(range(128 * 2))
    write_chain(pb, s, ("tenantA", "c"), toks, [b"a0", b"a1"])
    assert lookup(pb, s, ("tenantA", "c"), toks).cached_blocks == 2
    assert lookup(pb, s, ("tenantB", "c"), toks).cached_blocks == 0
    assert lookup(pb, s, ("tenantA", "other"), toks).cached_blocks == 0
