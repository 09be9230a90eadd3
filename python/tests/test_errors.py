"""One exception root: every failure the SDK raises is a ``kvtier.Error``,
caught with one ``except``, and nothing else is."""
from __future__ import annotations

import pytest

import kvtier
from kvtier import Client, HttpClient, Server

SMALL_MAX_BLOCK = 1 << 20  # small_server's --max-block-size


def test_a_refused_grpc_call_is_a_kvtier_error(small_server, ns):
    with Client(small_server.grpc) as c:
        with pytest.raises(kvtier.Error) as e:
            c.write(ns, [kvtier.Block(key=b"k" * 32, payload=b"x" * (SMALL_MAX_BLOCK + 1))])
    assert isinstance(e.value, kvtier.KvtierError) and "INVALID_ARGUMENT" in str(e.value)


def test_a_refused_http_request_is_a_kvtier_error(small_server, ns):
    with pytest.raises(kvtier.Error) as e:
        HttpClient(small_server.http).put(ns, "big", b"x" * (SMALL_MAX_BLOCK + 1))
    assert isinstance(e.value, kvtier.HttpError) and 400 <= e.value.status < 500


def test_a_server_that_cannot_start_is_a_kvtier_error(tmp_path):
    bogus = tmp_path / "kvtier"
    bogus.write_text("not a program")
    with pytest.raises(kvtier.Error) as e:
        Server.start(binary=bogus)
    assert isinstance(e.value, kvtier.ServerError)


def test_a_buffer_too_small_is_a_kvtier_error(server, ns):
    with Client(server.grpc) as c:
        assert c.data_plane() is not None
        c.write(ns, [kvtier.Block(key=b"b" * 32, payload=b"y" * 4096)])
        with pytest.raises(kvtier.Error):
            c.read(ns, [b"b" * 32], into=lambda i, n: bytearray(10))
