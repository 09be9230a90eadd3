"""TLS (docs/security.md): the Python client over gRPC and the data plane to a
server started with --tls-cert/--tls-key (and --tls-client-ca), certificates
made here with the openssl CLI; plaintext and unknown clients are refused."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kvtier import Client, KvtierError, keys
from kvtier.server import Server

BS = 128


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    return _make_pki(tmp_path_factory.mktemp("pki"))


def _make_pki(d: Path) -> Path:
    """ca.pem; server.pem/.key for 127.0.0.1; client.pem/.key; all signed by the CA."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=kvtier test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    for name, san, usage in [("server", "IP:127.0.0.1,DNS:localhost", "serverAuth"),
                             ("client", "DNS:client.kvtier.test", "clientAuth")]:
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(
            f"subjectAltName={san}\nbasicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
            "keyUsage=critical,digitalSignature\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
        )
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d


@pytest.fixture(scope="module")
def tls_server(kvtier_bin, pki):
    s = Server.start(kvtier_bin, ["--tls-cert", pki / "server.pem", "--tls-key", pki / "server.key"])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def mtls_server(kvtier_bin, pki):
    s = Server.start(kvtier_bin, ["--tls-cert", pki / "server.pem", "--tls-key", pki / "server.key",
                                  "--tls-client-ca", pki / "ca.pem"])
    yield s
    assert s.stop() == 0


@pytest.fixture(autouse=True)
def _no_tls_env(monkeypatch):
    for v in ("KVTIER_TLS_CA", "KVTIER_TLS_CERT", "KVTIER_TLS_KEY"):
        monkeypatch.delenv(v, raising=False)


def _round_trip(c: Client, ns: str) -> None:
    toks = list(range(3 * BS))
    data = [os.urandom(200_000) for _ in range(3)]
    assert c.write_tokens(ns, toks, data).stored == 3
    assert c.lookup(ns, tokens=toks).found == 3
    got = c.read(ns, c.keys_for(toks)).blocks
    assert [bytes(b.payload) for b in got] == data
    # Straight into caller buffers, over TLS too.
    bufs = [bytearray(len(x)) for x in data]
    c.read(ns, c.keys_for(toks), into=lambda i, n: bufs[i])
    assert [bytes(b) for b in bufs] == data


def test_grpc_and_data_plane_over_tls(tls_server, pki, monkeypatch):
    with Client(tls_server.grpc, tls_ca=str(pki / "ca.pem"), timeout=10) as c:
        _round_trip(c, "tls-py")
        pool = c.data_plane()
        assert pool is not None and pool.transport == "tcp", "the data plane carried the payloads, over TLS"
    # The environment works as well as arguments.
    monkeypatch.setenv("KVTIER_TLS_CA", str(pki / "ca.pem"))
    with Client(tls_server.grpc, timeout=10) as c:
        assert c.lookup("tls-py", tokens=list(range(3 * BS))).found == 3


def test_plaintext_and_unknown_cas_are_refused(tls_server, pki, tmp_path):
    with Client(tls_server.grpc, timeout=3, retries=0) as c:
        with pytest.raises(KvtierError):
            c.lookup("tls-py", keys=[keys.chain(list(range(BS)))[0]])
    # A CA that did not sign the server's certificate.
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "other.key", "-out", "other.pem", "-days", "2", "-subj", "/CN=other", cwd=tmp_path)
    with Client(tls_server.grpc, tls_ca=str(tmp_path / "other.pem"), timeout=3, retries=0) as c:
        with pytest.raises(KvtierError):
            c.lookup("tls-py", keys=[keys.chain(list(range(BS)))[0]])


def test_client_certificates_when_the_server_requires_them(mtls_server, pki):
    with Client(mtls_server.grpc, tls_ca=str(pki / "ca.pem"), tls_cert=str(pki / "client.pem"),
                tls_key=str(pki / "client.key"), timeout=10) as c:
        _round_trip(c, "mtls-py")
    with Client(mtls_server.grpc, tls_ca=str(pki / "ca.pem"), timeout=3, retries=0) as c:
        with pytest.raises(KvtierError):
            c.lookup("mtls-py", keys=[keys.chain(list(range(BS)))[0]])
    with pytest.raises(ValueError, match="go together"):
        Client(mtls_server.grpc, tls_ca=str(pki / "ca.pem"), tls_cert=str(pki / "client.pem"))


def test_sighup_rotates_the_certificate_without_a_restart(kvtier_bin, pki, tmp_path):
    """The files are replaced, SIGHUP is sent: new connections get the new
    certificate; the server process is the same one throughout."""
    live = tmp_path / "live"
    live.mkdir()
    for f in ("server.pem", "server.key"):
        shutil.copy(pki / f, live / f)
    (tmp_path / "new-pki").mkdir()
    new = _make_pki(tmp_path / "new-pki")
    s = Server.start(kvtier_bin, ["--tls-cert", live / "server.pem", "--tls-key", live / "server.key"])
    try:
        key = [keys.chain(list(range(BS)))[0]]

        def answers(ca: Path) -> bool:
            with Client(s.grpc, tls_ca=str(ca / "ca.pem"), timeout=3, retries=0) as c:
                try:
                    c.lookup("rot", keys=key)
                    return True
                except KvtierError:
                    return False

        assert answers(pki) and not answers(new)
        for f in ("server.pem", "server.key"):
            shutil.copy(new / f, live / f)
        assert not answers(new), "served before the SIGHUP"
        os.kill(s.pid, signal.SIGHUP)
        deadline = time.monotonic() + 20
        while not answers(new):
            assert time.monotonic() < deadline, "the new certificate was never served"
            time.sleep(0.05)
        assert not answers(pki)
        with Client(s.grpc, tls_ca=str(new / "ca.pem"), timeout=10) as c:
            _round_trip(c, "rot")  # gRPC and the data plane
        assert s.running
    finally:
        assert s.stop() == 0
