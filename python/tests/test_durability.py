"""Durability, observed in the kernel rather than assumed: with
``--disk-sync always`` an acknowledged write's record file has no dirty page
cache pages left (it was fdatasync'ed before the acknowledgement), checked
with the cachestat(2) syscall. The same check against ``--disk-sync never``
must see dirty pages, which shows the check can tell the difference: remove
the fsync calls from the disk tier and the first test fails."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from kvtier import Block, Client
from kvtier.server import Server

_CACHESTAT = 451  # the same number on every Linux architecture (6.5+)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


def dirty_pages(path: Path) -> int:
    """Dirty page-cache pages of ``path`` (cachestat(2) over the whole file)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        st = _Stat()
        rc = libc.syscall(_CACHESTAT, fd, ctypes.byref(_Range(0, 0)), ctypes.byref(st), 0)
        if rc != 0:
            err = ctypes.get_errno()
            raise AssertionError(f"cachestat(2) failed ({os.strerror(err)}); this test needs Linux 6.5+")
        return st.dirty + st.writeback
    finally:
        os.close(fd)


def records(d: Path) -> set[Path]:
    return {p for p in d.rglob("*.kvb")}


def write_and_observe(kvtier_bin, d: Path, mode: str, n: int = 6) -> list[int]:
    """Writes n 1 MiB blocks (write-through) and returns, per acknowledged
    write, the dirty pages of the record file it created."""
    server = Server.start(kvtier_bin, ["--disk-dir", str(d), "--disk-sync", mode,
                                       "--disk-capacity", "256MiB", "--write-policy", "write-through"])
    out = []
    try:
        with Client(server.grpc, timeout=30) as c:
            for i in range(n):
                before = records(d)
                payload = os.urandom(1 << 20)
                w = c.write("durable", [Block(key=b"dur-%04d" % i, payload=payload)])
                assert w.stored == 1
                new = records(d) - before
                assert len(new) == 1, f"one record file per acknowledged write, got {new}"
                out.append(dirty_pages(new.pop()))
    finally:
        server.stop()
    return out


def test_disk_sync_always_acknowledges_only_synced_records(kvtier_bin, tmp_path):
    dirty = write_and_observe(kvtier_bin, tmp_path / "always", "always")
    assert dirty == [0] * len(dirty), f"acknowledged records with dirty pages: {dirty}"


def test_the_check_sees_unsynced_records(kvtier_bin, tmp_path):
    # Without syncs the kernel holds the pages dirty for ~30 s
    # (vm.dirty_expire_centisecs); background writeback may flush some early,
    # so at least one of the writes must be seen dirty.
    dirty = write_and_observe(kvtier_bin, tmp_path / "never", "never")
    assert any(x > 0 for x in dirty), f"never-synced records all clean: {dirty}"
