"""A write tells the caller which blocks the server keeps in memory only
(``WriteResult.deferred``; docs/cache-choice.md, "Admission to the lower
tiers"), through the native data plane and the gRPC fallback alike, with
``kvtier serve --disk-admission reuse``."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvtier import Block, Client
from kvtier.server import Server

BLOCK = 4 << 20


@pytest.fixture(scope="module")
def reuse_server(kvtier_bin: Path, tmp_path_factory):
    disk = tmp_path_factory.mktemp("disk")
    s = Server.start(binary=kvtier_bin, args=["--disk-dir", str(disk), "--disk-admission", "reuse"])
    yield s
    s.stop()


@pytest.mark.parametrize("data_plane", [True, False], ids=["data-plane", "grpc"])
def test_first_writes_are_deferred_and_a_second_use_is_not(reuse_server, data_plane: bool):
    ns = f"adm-{data_plane}"
    with Client(reuse_server.grpc, data_plane=data_plane) as c:
        blocks = [Block(f"k{i}".encode(), bytes([i]) * BLOCK) for i in range(3)]
        w = c.write(ns, blocks)
        assert (w.stored, w.deferred) == (3, 3), w
        r = c.read(ns, [b.key for b in blocks[:1]])
        assert len(r.blocks) == 1
        w = c.write(ns, blocks[1:2])
        assert w.stored + w.existing == 1 and w.deferred == 0, w


def test_an_unknown_admission_policy_stops_the_server_naming_the_choices(kvtier_bin: Path, tmp_path):
    with pytest.raises(Exception) as e:
        Server.start(binary=kvtier_bin, args=["--disk-dir", str(tmp_path), "--disk-admission", "lfu"],
                     timeout=30)
    assert "all, reuse or tinylfu" in str(e.value)
