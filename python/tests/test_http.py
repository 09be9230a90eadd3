"""The HTTP key/value API through kvtier.http."""
from __future__ import annotations

import os

import pytest

from kvtier import Client, HttpClient, HttpError

SMALL_MAX_BLOCK = 1 << 20  # small_server's --max-block-size


@pytest.fixture
def http(server):
    return HttpClient(server.http)


def test_put_get_delete(http, ns):
    value = os.urandom(200_000)
    assert http.get(ns, "greeting") is None
    http.put(ns, "greeting", value)
    assert http.get(ns, "greeting") == value
    http.put(ns, "greeting", b"replaced")  # PUT replaces
    assert http.get(ns, "greeting") == b"replaced"
    assert http.delete(ns, "greeting") is True
    assert http.get(ns, "greeting") is None
    assert http.delete(ns, "greeting") is False


def test_not_found_and_empty_value(http, ns):
    assert http.get(ns, "never-written") is None
    assert http.delete(ns, "never-written") is False
    http.put(ns, "empty", b"")
    assert http.get(ns, "empty") == b""


def test_odd_names_are_one_path_segment(http, ns):
    spaced_ns = ns + "/tenant:a"  # '/' is legal in namespaces
    http.put(spaced_ns, "a key/with?odd&chars", b"v1")
    assert http.get(spaced_ns, "a key/with?odd&chars") == b"v1"
    assert http.get(ns, "a key/with?odd&chars") is None


def test_ttl_is_accepted(http, ns):
    http.put(ns, "t", b"x", ttl_ms=60_000)
    assert http.get(ns, "t") == b"x"


def test_http_values_are_blocks_visible_over_grpc(server, http, ns):
    http.put(ns, "shared", b"same engine")
    with Client(server.grpc, connections=1) as c:
        assert c.lookup(ns, keys=[b"shared"]).found == 1
        assert c.read(ns, [b"shared"]).payloads == [b"same engine"]


def test_invalid_namespace_is_400(http):
    with pytest.raises(HttpError) as ei:
        http.put("n" * 129, "k", b"v")
    assert ei.value.status == 400
    assert "128" in ei.value.message


def test_payload_too_large_is_413(small_server, ns):
    http = HttpClient(small_server.http)
    with pytest.raises(HttpError) as ei:
        http.put(ns, "big", bytes(SMALL_MAX_BLOCK + 1))
    assert ei.value.status == 413
    assert ei.value.code == "payload_too_large"
    assert http.get(ns, "big") is None
    http.put(ns, "fits", bytes(SMALL_MAX_BLOCK))
    assert http.get(ns, "fits") == bytes(SMALL_MAX_BLOCK)


def test_healthz(http):
    assert http.healthz()
