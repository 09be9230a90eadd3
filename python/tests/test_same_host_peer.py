"""The same-host socket touches no process's memory: bytes move only through
shared memory the server created (docs/security.md, "Shared memory"), so
the attacks on the earlier design, where the server copied into and out of
the connecting process by pid, find nothing. Each test plays an attacker
against the real server (root here, so a server that still addressed
processes by pid would reach any of them):

* the connecting process exits and its pid is given to a victim holding a
  secret (forced through /proc/sys/kernel/ns_last_pid), while the socket
  lives on in another process (inherited over fork, or passed over
  SCM_RIGHTS);
* the connecting process (uid nobody) execs a setuid-root program while a
  child keeps the socket.

The attacker sends the removed requests that named addresses in the
connecting process (kinds 4 and 5) and the shared-memory ones (MapRead,
Lend + WriteLent). The victim's memory must be neither read (nothing of it
stored, nothing of it in any segment the attacker is handed) nor written,
and no refusal names a pid."""
from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import signal
import socket
import struct
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from kvtier._crc import crc32c
from kvtier.pb import v1 as pb
from kvtier.pb import wire as wpb
from kvtier.server import Server

from frames import HEADER, Kind, frame

NOBODY = 65534
SECRET = b"victim-secret:" + os.urandom(16).hex().encode() + b"!" * 4050  # one page and some
NS = "attack"
SYSTEM_PYTHON = "/usr/bin/python3"

#: The setuid test's connector, run as nobody: connects, says Hello (so the
#: server takes it as a data-plane connection while it is nobody), hands the
#: socket over fd argv[2], then execs the setuid program argv[3].
CONNECTOR = """
import os, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(struct.pack("<4sBBHQII", b"KVW1", 3, 0, 0, 1, 0, 0))
got = b""
while len(got) < 24:
    got += s.recv(24 - len(got))
socket.send_fds(socket.socket(fileno=int(sys.argv[2])), [b"s"], [s.fileno()])
os.execv(sys.argv[3], [sys.argv[3], "30"])
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                reason="plays processes of other uids: needs root")


@pytest.fixture
def open_dir():
    """A directory every uid may enter (pytest's tmp_path is root's only)."""
    d = Path(tempfile.mkdtemp(prefix="kvtier-peer-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sock_server(kvtier_bin, open_dir):
    """A server whose same-host socket anyone may open (mode 0666)."""
    path = open_dir / "kvtier.sock"
    conf = open_dir / "kvtier.toml"
    conf.write_text(f'[server]\nlocal_listen = "{path}"\nlocal_mode = "0666"\n')
    s = Server.start(binary=kvtier_bin, args=["--config", str(conf)])
    yield str(path)
    s.stop()


def _recv(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            raise ConnectionError("closed by the server")
        buf += b
    return buf


def call(s: socket.socket, kind: int, meta: bytes, data: bytes = b"") -> tuple[int, bytes, bytes]:
    s.sendall(frame(kind, 7, meta, data))
    h = HEADER.unpack(_recv(s, HEADER.size))
    return h[1], _recv(s, h[5]), _recv(s, h[6])


#: The removed same-host requests: ReadInto (4) and WriteFrom (5), which
#: named an address and a length in the connecting process's memory.
READ_INTO, WRITE_FROM = 4, 5


def old_copy(s: socket.socket, kind: int, addr: int, n: int) -> tuple[int, bytes, bytes] | None:
    """Sends a removed copy request naming ``addr``; the reply, or None when
    the server closed the connection instead."""
    try:
        return call(s, kind, struct.pack("<QQ", addr, n))
    except (ConnectionError, BrokenPipeError):
        return None


def map_read_scan(s: socket.socket, key: bytes, needle: bytes) -> bool:
    """MapRead of ``key`` on ``s``: maps every segment handed over and tells
    whether any holds ``needle``."""
    r = wpb.WireReadRequest(request=pb.ReadRequest(namespace=NS, keys=[key]))
    s.sendall(frame(Kind.MAP_READ, 8, r.SerializeToString()))
    head, fds, _, _ = socket.recv_fds(s, HEADER.size, 16)
    head += _recv(s, HEADER.size - len(head))
    h = HEADER.unpack(head)
    meta, _ = _recv(s, h[5]), _recv(s, h[6])
    assert h[1] == Kind.MAP_READ_REPLY, wpb.WireError.FromString(meta)
    found = False
    for fd in fds:
        with os.fdopen(fd, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            found |= m.find(needle) >= 0
    return found


def write(s, key: bytes, payload: bytes):
    blk = pb.Block(key=key, token_count=1, crc32c=crc32c(payload))
    w = wpb.WireWriteRequest(request=pb.WriteRequest(namespace=NS, blocks=[blk]), payload_lengths=[len(payload)])
    kind, meta, _ = call(s, Kind.WRITE, w.SerializeToString(), payload)
    assert kind == Kind.WRITE_REPLY, wpb.WireError.FromString(meta)


def assert_refused(reply, pid: int) -> None:
    if reply is None:
        return  # closed: refused without an answer
    kind, meta, _ = reply
    assert kind == Kind.ERROR, f"the server answered a copy request (reply kind {kind:#x})"
    e = wpb.WireError.FromString(meta)
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], e
    assert str(pid) not in e.message, f"the refusal names the pid: {e.message}"


def stored(path: str, key: bytes) -> bool:
    """Whether ``key`` is stored (a fresh, honest connection reads it)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        r = wpb.WireReadRequest(request=pb.ReadRequest(namespace=NS, keys=[key]))
        kind, meta, _ = call(s, Kind.READ, r.SerializeToString())
        assert kind == Kind.READ_REPLY, wpb.WireError.FromString(meta)
        return len(wpb.WireReadReply.FromString(meta).blocks) > 0


def connect_and_hand_over(path: str, via: str, key: bytes) -> tuple[socket.socket, int]:
    """A child connects to ``path``, stores a block under ``key`` (so the
    server has taken the connection as a data-plane one while the child
    lives), hands the socket to this process (``via`` "fork": through a
    grandchild that inherited it; "scm": itself, over SCM_RIGHTS), then
    exits and is reaped. Returns the socket and the connecting process's
    (now free) pid."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the connecting process
        try:
            a.close()
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            write(s, key, b"A" * len(SECRET))
            if via == "fork":
                if os.fork() == 0:  # the holder: outlives the connecting process
                    time.sleep(0.2)
                    socket.send_fds(b, [b"s"], [s.fileno()])
                    os._exit(0)
            else:
                socket.send_fds(b, [b"s"], [s.fileno()])
        finally:
            os._exit(0)
    b.close()
    os.waitpid(pid, 0)
    _, fds, _, _ = socket.recv_fds(a, 1, 1)
    a.close()
    return socket.socket(fileno=fds[0]), pid


def victim_at(pid: int):
    """Forks a victim holding SECRET in a buffer, with pid ``pid`` (forced
    through ns_last_pid; retried, as another process may take it first).
    Returns (victim pid, buffer address, pipe to stop it, pipe it answers on)."""
    for _ in range(20):
        go_r, go_w = os.pipe()
        back_r, back_w = os.pipe()
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        v = os.fork()
        if v == 0:
            buf = ctypes.create_string_buffer(SECRET, len(SECRET))
            os.write(back_w, struct.pack("<Q", ctypes.addressof(buf)))
            os.read(go_r, 1)
            os.write(back_w, buf.raw[: len(SECRET)])
            os._exit(0)
        os.close(go_r)
        os.close(back_w)
        if v == pid:
            (addr,) = struct.unpack("<Q", os.read(back_r, 8))
            return v, addr, go_w, back_r
        os.close(go_w)
        os.close(back_r)
        os.waitpid(v, 0)
    pytest.fail(f"pid {pid} could not be reused after 20 tries")


def victim_buffer(go_w: int, back_r: int, v: int) -> bytes:
    os.write(go_w, b"x")
    out = b""
    while len(out) < len(SECRET):
        chunk = os.read(back_r, 65536)
        if not chunk:
            break
        out += chunk
    os.waitpid(v, 0)
    return out


@pytest.mark.parametrize("via", ["fork", "scm"])
def test_a_reused_pid_finds_nothing_to_copy_into_or_out_of(sock_server, via):
    # The attacker's own block, to be copied into the victim's buffer.
    sock, pid = connect_and_hand_over(sock_server, via, b"attacker-block-" + via.encode())
    with sock:
        v, addr, go_w, back_r = victim_at(pid)
        try:
            # Shared memory works for the socket's holder, and holds only
            # what the server stored: its own block, nothing of the victim.
            assert not map_read_scan(sock, b"attacker-block-" + via.encode(), SECRET[:64])
            # The removed copies, naming the victim's memory: refused.
            assert_refused(old_copy(sock, WRITE_FROM, addr, len(SECRET)), pid)
            assert_refused(old_copy(sock, READ_INTO, addr, len(SECRET)), pid)
            assert not stored(sock_server, b"stolen-" + via.encode())
        finally:
            got = victim_buffer(go_w, back_r, v)
        assert got == SECRET, "the victim's memory was overwritten"


def test_a_setuid_exec_after_connect_exposes_nothing(sock_server, open_dir):
    prog = open_dir / "suid-sleep"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", prog)
    os.chown(prog, 0, 0)
    os.chmod(prog, 0o4755)
    a, b = socket.socketpair()
    os.set_inheritable(b.fileno(), True)
    pid = os.fork()
    if pid == 0:  # the connector: nobody (by a fresh exec: dumpable), then the setuid program
        try:
            a.close()
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, "-c", CONNECTOR, sock_server, str(b.fileno()), str(prog)])
        finally:
            os._exit(1)
    b.close()
    _, fds, _, _ = socket.recv_fds(a, 1, 1)
    a.close()
    sock = socket.socket(fileno=fds[0])
    try:
        for _ in range(200):  # until the exec is done: euid 0
            with open(f"/proc/{pid}/status") as f:
                uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
            if uids[1] == "0":
                break
            time.sleep(0.01)
        else:
            pytest.fail(f"the setuid exec did not happen: Uid {uids}")
        # A page of the now-root process, readable and writable.
        with open(f"/proc/{pid}/maps") as f:
            rw = next(int(line.split("-")[0], 16) for line in f if line.split()[1].startswith("rw"))
        # The attacker's bytes, to be copied into that page. (Not a
        # before/after comparison of the page: right after the exec the
        # program's loader still writes its own data pages, which made such a
        # comparison fail without any attack.)
        attack = b"Z" * 4096
        write(sock, b"suid-into", attack)
        assert_refused(old_copy(sock, WRITE_FROM, rw, 4096), pid)
        assert_refused(old_copy(sock, READ_INTO, rw, 4096), pid)
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(rw)
            assert attack[:64] not in mem.read(4096), "a setuid process's memory was overwritten"
    finally:
        sock.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
