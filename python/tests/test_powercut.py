"""Power cuts under load, on a file system that forgets what was not synced.

The disk tier of a real ``kvtier serve`` lives on the powercut FUSE file
system (``python/tests/powercut``: a passthrough that, at a cut, keeps only
file data made durable by ``fsync``/``fdatasync`` and directory entries made
durable by an ``fsync`` of their directory; the model is at the top of
``powercut/fs.py``). The memory tier is 1 MiB, so restarts read from disk. A
writer thread stores blocks of 64-256 KiB with payloads derived from their
keys through the Python SDK (1-3 blocks per request, data plane), recording
which writes were acknowledged and when. At a seeded random moment the test
cuts the power: SIGKILL the server, unmount (the file system rolls back to
its durable state), mount, restart. Each restart is checked, then a seeded
random part of the blocks is deleted before the next round of load.

* ``disk.sync = always`` (24 cuts): every acknowledged block is served
  byte-identical after every cut; every acknowledged delete stays deleted;
  recovery finds no torn or corrupt record (a record's name is never durable
  before its data).
* ``disk.sync = batch`` with ``batch_interval = 100ms`` (16 cuts): nothing
  is served that differs from what was written; an acknowledged block may
  be missing only if it was acknowledged less than ``BATCH_WINDOW_S`` before
  the cut (the interval plus the flush: docs/durability.md); a deleted block
  may come back, intact. And some acknowledged block *was* lost at some cut
  (the control: the file system really drops what the flusher had not
  synced yet).
* Under both, a block whose write was in flight at the cut is either absent
  or intact, and the cuts did throw away unsynced state.

``disk.dir`` is ``var/lib/kvtier/disk`` under the mount, made by the server
at its first start, so the durability of the tier's directory itself is
tested too.

Each sync call of the disk tier was removed in turn from a scratch build
(2026-11-27; docs/durability.md, "Power cuts", has the table), and this test
then failed, at the first cut:

* ``disk/store.rs``, ``fdatasync`` of the record before its rename (always:
  recovery drops torn records; also checked by deleting the line itself);
* ``disk/store.rs``, ``fsync`` of the shard directory after the rename
  (always: an acknowledged block is missing; also checked by deleting the
  lines themselves);
* ``disk/store.rs``, ``fsync`` of the shard directories after an explicit
  delete (always: a deleted block comes back);
* ``disk/background.rs``, the flusher's ``fdatasync`` and, separately, its
  directory ``fsync`` (batch: a block acknowledged 0.68 s before the cut is
  missing);
* ``disk/recovery.rs``, ``fsync`` of ``FORMAT``'s data (the restarted server
  finds an empty FORMAT and refuses the directory), of ``blocks/`` and of the
  tier's directory after ``blocks/`` was made, and of the parent of each
  directory ``disk.dir`` needed created (always: an acknowledged block is
  missing; without the last one, which this test led to, all of them were).

The ``fsync`` of the tier's directory right after the ``FORMAT`` rename is
covered by the one after ``blocks/`` is made, in the same function, before
anything can be written: removing it alone changes nothing a cut can show
(the test passes without it, as it should).

Needs root, /dev/fuse, fusermount3 and libfuse 3 (Debian ``fuse3``, installed
by ``scripts/setup.sh --test``) and ``mfusepy`` (python/requirements-dev.txt).
Without them the test fails, saying what to install (never a skip).
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import kvtier
from kvtier import Block, Client
from kvtier.server import Server

# A helper of python/tests (on sys.path, as conftest is); kept out of import sorting.
from powercut import PowercutMount, missing  # isort: skip

NS = "powercut"
BATCH_INTERVAL_S = 0.1
#: How long before a cut an acknowledged write may be lost under ``batch``:
#: the interval, plus time for the flusher to sync its queue, plus scheduling
#: delay on a loaded two-core CI machine.
BATCH_WINDOW_S = BATCH_INTERVAL_S + 0.4
#: Longest load before a cut. Under ``batch`` it is well past BATCH_WINDOW_S,
#: so that a flusher that does not sync loses blocks older than the window.
LOAD_S = {"always": 0.6, "batch": 1.2}


@pytest.fixture
def powercut_fs(tmp_path):
    lacking = missing()
    if lacking:
        msg = "the power-cut test needs " + ", ".join(lacking) + " (scripts/setup.sh --test installs them)"
        pytest.fail(msg)
    # The backing and durable state live on a tmpfs of their own: the daemon's
    # bookkeeping (a power cut rebuilds 256 shard directories) is then not
    # slowed by ext4's journal, and nothing is left behind.
    work = tmp_path / "tmpfs"
    work.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", str(work)], capture_output=True, text=True)
    assert r.returncode == 0, f"mounting a tmpfs for the power-cut file system's state: {r.stderr}"
    fs = PowercutMount(work / "fs", tmp_path / "mnt")
    try:
        yield fs
    finally:
        fs.close()
        print(f"powercut file system log:\n{fs.log_tail()}")  # shown when the test fails
        subprocess.run(["umount", str(work)], capture_output=True)


def payload(key: bytes) -> bytes:
    """The block stored under ``key``: 64-256 KiB, a function of the key only."""
    rng = random.Random(key)
    return rng.randbytes(rng.randrange(64 << 10, 256 << 10))


@dataclass
class Ledger:
    """What the clients were told, with monotonic times."""

    acked: dict[bytes, float] = field(default_factory=dict)  # key -> when its write was acknowledged
    attempted: set[bytes] = field(default_factory=set)  # keys of writes sent, acknowledged or not
    deleted: set[bytes] = field(default_factory=set)  # keys whose delete was acknowledged
    lock: threading.Lock = field(default_factory=threading.Lock)


class Writer(threading.Thread):
    """Writes fresh blocks, 1-3 per request, until stopped or the server dies."""

    def __init__(self, addr: str, ledger: Ledger, seed: int, first: int) -> None:
        super().__init__(daemon=True)
        self.addr, self.ledger, self.rng, self.next = addr, ledger, random.Random(seed), first
        self.stop = threading.Event()
        self.acked_here = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.addr, connections=1, timeout=10.0, retries=0) as c:
                while not self.stop.is_set():
                    keys = [b"pc-%07d" % (self.next + i) for i in range(self.rng.randint(1, 3))]
                    self.next += len(keys)
                    with self.ledger.lock:
                        self.ledger.attempted.update(keys)
                    try:
                        r = c.write(NS, [Block(key=k, payload=payload(k)) for k in keys])
                    except kvtier.Error:
                        return  # the server is gone: this write is not acknowledged
                    now = time.monotonic()
                    assert r.stored == len(keys), r
                    with self.ledger.lock:
                        for k in keys:
                            self.ledger.acked[k] = now
                    self.acked_here += len(keys)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread, which raises it
            self.error = e


def start_server(kvtier_bin: Path, cfg: Path) -> Server:
    return Server.start(kvtier_bin, args=["--config", str(cfg)], timeout=60)


def recovery_drops(server: Server) -> dict[str, int]:
    assert server.http
    with urllib.request.urlopen(f"http://{server.http}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m[1]: int(float(m[2])) for m in
            re.finditer(r'^kvtier_disk_recovery_dropped_files\{reason="(\w+)"\} (\S+)$', text, re.M)}


def read_one(c: Client, key: bytes) -> bytes | None:
    r = c.read(NS, [key])
    return bytes(r.blocks[0].payload) if r.blocks else None


def forget(ledger: Ledger, key: bytes) -> None:
    ledger.attempted.discard(key)
    ledger.acked.pop(key, None)
    ledger.deleted.discard(key)


def verify(server: Server, ledger: Ledger, mode: str, cut_at: float | None, lost: list[float]) -> None:
    """Checks what a restarted server serves against what was acknowledged
    before the cut at ``cut_at``, then updates the ledger to what it serves
    now: after a restart, whatever is served is on durable storage."""
    with Client(server.grpc, connections=1, timeout=30.0) as c:
        for key in sorted(ledger.attempted):
            got = read_one(c, key)
            if got is not None:
                if got != payload(key):
                    raise AssertionError(f"{mode}: {key!r} served with other bytes than were written")
                if mode == "always" and key in ledger.deleted:
                    raise AssertionError(f"always: {key!r} was deleted (acknowledged) and came back after a cut")
                ledger.deleted.discard(key)  # batch: a delete not synced yet; the block is back, intact
                ledger.acked[key] = 0.0  # served after a restart: durable from now on
            elif key in ledger.acked and key not in ledger.deleted:
                if mode == "always":
                    raise AssertionError(f"always: acknowledged {key!r} is missing after a cut")
                assert cut_at is not None, f"{key!r} is missing from a server that was stopped cleanly"
                age = cut_at - ledger.acked[key]
                if age >= BATCH_WINDOW_S:
                    raise AssertionError(
                        f"batch: {key!r}, acknowledged {age:.3f} s before the cut, is missing "
                        f"(only writes acknowledged within {BATCH_WINDOW_S} s of a cut may be lost)")
                lost.append(age)
                forget(ledger, key)
            else:
                forget(ledger, key)  # deleted, or never acknowledged, and not stored


def run_cuts(kvtier_bin: Path, tmp_path: Path, fs: PowercutMount, mode: str, cuts: int, seed: int) -> None:
    rng = random.Random(seed)
    cfg = tmp_path / "kvtier.toml"
    # The server creates disk.dir and its parents (as deploy/'s /var/lib/kvtier/disk).
    cfg.write_text(
        '[engine]\nmemory_capacity = "1MiB"\n'
        f'[disk]\ndir = "{fs.mnt}/var/lib/kvtier/disk"\ncapacity = "4GiB"\nsync = "{mode}"\n'
        f'batch_interval = "{int(BATCH_INTERVAL_S * 1000)}ms"\nwrite_policy = "write-through"\n'
    )
    ledger, lost, written = Ledger(), [], 0
    cut_at: float | None = None
    fs.mount()
    for cut in range(cuts + 1):
        server = start_server(kvtier_bin, cfg)
        try:
            drops = recovery_drops(server)
            if mode == "always":
                assert drops.get("torn", 0) == 0 and drops.get("corrupt", 0) == 0, (
                    f"always, after cut {cut}: recovery dropped torn/corrupt records {drops}: a record's "
                    "name was durable before its data")
            verify(server, ledger, mode, cut_at, lost)
            if cut == cuts:
                assert server.stop() == 0, "graceful exit on SIGTERM"
                break
            # Deletes (acknowledged before the load starts), which also keep the tier small.
            live = sorted(k for k in ledger.acked if k not in ledger.deleted)
            doomed = rng.sample(live, k=len(live) // 3 if len(live) < 40 else len(live) - 25)
            with Client(server.grpc, connections=1, timeout=30.0) as c:
                for i in range(0, len(doomed), 8):
                    batch = doomed[i:i + 8]
                    assert c.delete(NS, batch).deleted == len(batch), batch
                    ledger.deleted.update(batch)
            writer = Writer(server.grpc, ledger, rng.randrange(1 << 30), written)
            writer.start()
            # The cut falls at a seeded random moment of the load (this sleep is the experiment, not a wait).
            time.sleep(rng.uniform(0.05, LOAD_S[mode]))
            cut_at = time.monotonic()
            os.kill(server.pid, signal.SIGKILL)
            server.proc.wait(timeout=30)
            writer.stop.set()
            writer.join(timeout=60)
            assert not writer.is_alive(), "the writer did not notice that the server was gone"
            if writer.error is not None:
                raise writer.error
            written = writer.next
        finally:
            if server.running:
                os.kill(server.pid, signal.SIGKILL)
            server.stop()
        fs.power_off()
        fs.mount()
    threw_away = sum(len(c["lost_names"]) + c["reverted_files"] for c in fs.cuts)
    assert threw_away > 0, f"{mode}: no cut threw anything away: the file system is not cutting power"
    if mode == "batch":
        assert lost, "batch: no cut lost an acknowledged write: the file system is not dropping unsynced data"
    print(f"{mode}: {cuts} cuts, {written} blocks written, {len(ledger.acked)} live at the end, "
          f"{len(lost)} acknowledged lost (oldest {max(lost, default=0):.3f} s before its cut), "
          f"{threw_away} unsynced names/files thrown away")


@pytest.mark.parametrize(("mode", "cuts", "seed"), [("always", 24, 20260101), ("batch", 16, 20260102)])
def test_power_cuts_lose_nothing_acknowledged_beyond_the_sync_mode(kvtier_bin, tmp_path, powercut_fs, mode, cuts,
                                                                  seed):
    run_cuts(kvtier_bin, tmp_path, powercut_fs, mode, cuts, seed)
