"""A request the server can never accept is refused as such, and the refusal
reaches the client (docs/operations.md, "What a refused client sees"): a
data-plane write of one block larger than the server's request memory raises
RESOURCE_EXHAUSTED at once (not UNAVAILABLE after retries on a reset
connection), and an HTTP PUT over it is a 413 naming the limit, from the
SDK, from curl and from the CLI.

The server: a 192 MiB memory tier, so ``server.request_memory`` is its 64 MiB
default (max(tier / 4, 64 MiB)); blocks up to 128 MiB and messages up to the
default 256 MiB, so the request memory, not a size limit the client checks
before sending, is what refuses a 96 MiB block."""
from __future__ import annotations

import shutil
import subprocess
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


def _big_file(tmp_path):
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.truncate(BIG)  # sparse: 96 MiB of zeros without writing them
    return path


def test_curl_gets_the_413_not_a_reset(tight_server, ns, tmp_path):
    """The report this came from: curl PUT of a body over the request memory
    saw only `100 Continue` and a reset. It must see the 413 and its body."""
    curl = shutil.which("curl")
    assert curl, "curl is needed for this test (apt-get install curl)"
    out = subprocess.run(
        [curl, "-sS", "-X", "PUT", "--data-binary", f"@{_big_file(tmp_path)}",
         "-o", str(tmp_path / "body"), "-w", "%{http_code}",
         f"http://{tight_server.http}/v1/kv/{ns}/big"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "413", out
    body = (tmp_path / "body").read_text()
    assert "server.request_memory" in body, body


def test_the_cli_reports_the_refusal_and_the_setting(tight_server, ns, tmp_path, kvtier_bin):
    t = time.monotonic()
    out = subprocess.run(
        [str(kvtier_bin), "put", "--server", f"http://{tight_server.grpc}", "-n", ns,
         "--text-key", "big", "-f", str(_big_file(tmp_path))],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0, out
    assert "server.request_memory" in out.stderr, out.stderr
    assert "unavailable" not in out.stderr.lower(), out.stderr
    assert time.monotonic() - t < 10, "retried?"
