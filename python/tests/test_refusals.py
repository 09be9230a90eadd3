"""A request the server can never accept is refused as such, and the refusal
reaches the client (docs/operations.md, "What a refused client sees"): a
data-plane write of one block larger than the server's request memory raises
RESOURCE_EXHAUSTED at once (not UNAVAILABLE after retries on a reset
connection), and an HTTP PUT over it is a 413 naming the limit.

The server: a 192 MiB memory tier, so ``server.request_memory`` is its 64 MiB
default (max(tier / 4, 64 MiB)); blocks up to 128 MiB and messages up to the
default 256 MiB, so the request memory, not a size limit the client checks
before sending, is what refuses a 96 MiB block."""
from __future__ import annotations

import time

import grpc
import pytest

import kvtier
from kvtier import Client, HttpClient
from kvtier.server import Server

MIB = 1 << 20
BIG = 96 * MIB


@pytest.fixture(scope="module")
def tight_server(kvtier_bin):
    s = Server.start(binary=kvtier_bin, args=["--memory-capacity", "192MiB", "--max-block-size", "128MiB"])
    yield s
    assert s.stop() == 0


def test_a_write_over_the_request_memory_is_resource_exhausted_at_once(tight_server, ns):
    with Client(tight_server.grpc, timeout=30.0) as c:
        assert c.data_plane() is not None
        t = time.monotonic()
        with pytest.raises(kvtier.KvtierError) as e:
            c.write(ns, [kvtier.Block(key=b"k" * 32, payload=b"x" * BIG)])
        elapsed = time.monotonic() - t
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
        assert "server.request_memory" in e.value.message, e.value
        assert elapsed < 1.0, f"refused after {elapsed:.2f} s: retried?"
        # The client and the server are fine afterwards.
        c.write(ns, [kvtier.Block(key=b"s" * 32, payload=b"y" * 4096)])


def test_an_http_put_over_the_request_memory_is_413(tight_server, ns):
    with pytest.raises(kvtier.HttpError) as e:
        HttpClient(tight_server.http).put(ns, "big", b"x" * BIG)
    assert e.value.status == 413, e.value
    assert "server.request_memory" in e.value.message, e.value
