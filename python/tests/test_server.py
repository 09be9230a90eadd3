"""kvtier.server.Server: starting and stopping the real binary."""
from __future__ import annotations

import os

import pytest

from kvtier import Client, Server, ServerError
from kvtier.server import find_binary


def test_start_reports_addresses_and_stops_gracefully(kvtier_bin):
    s = Server.start(binary=kvtier_bin)
    try:
        assert s.running
        assert s.ready["pid"] == s.pid
        assert s.grpc.startswith("127.0.0.1:") and s.http.startswith("127.0.0.1:")
        with Client(s.grpc, connections=1) as c:
            assert c.stats().version
    finally:
        code = s.stop()
    assert code == 0
    assert not s.running
    assert s.stop() == 0  # idempotent


def test_context_manager_stops(kvtier_bin):
    with Server.start(binary=kvtier_bin) as s:
        pid = s.pid
        assert s.running
    assert not s.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_bad_flags_fail_fast_with_stderr(kvtier_bin):
    with pytest.raises(ServerError) as ei:
        Server.start(binary=kvtier_bin, args=["--memory-capacity", "lots"], timeout=30)
    assert "exited before it was ready" in str(ei.value)
    assert "lots" in str(ei.value)  # the server's own message is included


def test_find_binary_honours_env(kvtier_bin, monkeypatch, tmp_path):
    monkeypatch.setenv("KVTIER_BIN", str(kvtier_bin))
    assert find_binary() == kvtier_bin
    monkeypatch.setenv("KVTIER_BIN", str(tmp_path / "missing"))
    with pytest.raises(ServerError):
        find_binary()


def test_start_pinned_starts_the_server_on_those_cpus(kvtier_bin):
    """``cpus=`` pins the server from its start (its runtime sizes itself then)
    and leaves the caller's own affinity as it was."""
    mine = os.sched_getaffinity(0)
    cpu = min(mine)
    with Server.start(binary=kvtier_bin, cpus={cpu}) as s:
        assert os.sched_getaffinity(s.pid) == {cpu}
        with Client(s.grpc, connections=1) as c:
            assert c.stats().version
    assert os.sched_getaffinity(0) == mine
    with Server.start(binary=kvtier_bin) as s:
        assert os.sched_getaffinity(s.pid) == mine


def test_start_pinned_to_cpus_it_cannot_have_says_so(kvtier_bin):
    """A CPU set the machine cannot give is a clear error naming it, not a
    failure to run the binary, and the caller's affinity is left alone."""
    mine = os.sched_getaffinity(0)
    with pytest.raises(ServerError, match=r"cannot pin the server to CPUs \[4096\]"):
        Server.start(binary=kvtier_bin, cpus={4096})
    with pytest.raises(ServerError, match="cannot pin the server to CPUs"):
        Server.start(binary=kvtier_bin, cpus=set())
    assert os.sched_getaffinity(0) == mine
