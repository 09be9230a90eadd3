"""The soak's fault injectors that are not a signal to a process: a TCP
proxy that can black-hole (a one-node partition between kvtier and its
object store), a size-limited tmpfs with a ballast file (a full disk), and an
HTTP client that stalls mid-body. docs/durability.md, "A soak with faults",
says what each one does to the server.
"""
from __future__ import annotations

import atexit
import errno
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["BlackHoleProxy", "Tmpfs", "stall_put"]


class BlackHoleProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream``, one thread pair per
    connection. :meth:`partition` stops forwarding without closing anything:
    new connections are accepted and never connected upstream, bytes already
    in flight are held, so both sides see silence, as behind a dropped route;
    :meth:`heal` lets everything flow again (the held connections resume).
    While the upstream is down (a stopped store), a new connection is closed
    at once, as a refused connection would be."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self.accepted = 0
        self.upstream_failures = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def partition(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def _wait_flowing(self) -> bool:
        while not self._flowing.wait(0.2):
            if self._closing.is_set():
                return False
        return not self._closing.is_set()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        self._track(conn)
        if not self._wait_flowing():
            self._close(conn)
            return
        try:
            up = socket.create_connection(self.upstream, timeout=2)
        except OSError:
            self.upstream_failures += 1
            self._close(conn)
            return
        self._track(up)
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            src.settimeout(0.5)  # the other direction may have closed it already
            while not self._closing.is_set():
                try:
                    data = src.recv(65536)
                except socket.timeout:
                    continue
                if not data or not self._wait_flowing():
                    break
                dst.sendall(data)
        except OSError:
            pass
        self._close(src)
        self._close(dst)

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.add(s)

    def _close(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.discard(s)
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def close(self) -> None:
        self._closing.set()
        self._flowing.set()
        self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            self._close(s)


class Tmpfs:
    """A tmpfs of ``size_mib`` mounted at ``path`` (root only), unmounted by
    :meth:`unmount`, or at exit if the caller never got there. A ballast file
    beside the disk tier's directory fills it (a real ``ENOSPC``) and is
    removed to heal."""

    def __init__(self, path: Path, size_mib: int):
        self.path = path
        self.size_mib = size_mib
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", str(path)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mount -t tmpfs at {path} failed (the soak runs as root): {r.stderr.strip()}")
        self.mounted = True
        self.ballast = path / "ballast"
        self._stop = threading.Event()
        self._filler: threading.Thread | None = None
        atexit.register(self.unmount)

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def _top_up(self) -> int:
        """Appends zeros to the ballast until ENOSPC; the bytes added."""
        added = 0
        chunk = b"\0" * (1 << 20)
        with open(self.ballast, "ab") as f:
            for size in (1 << 20, 4096):
                while True:
                    try:
                        n = os.write(f.fileno(), chunk[:size])
                    except OSError as e:
                        if e.errno in (errno.ENOSPC, errno.EDQUOT):
                            break
                        raise
                    added += n
                    if n < size:
                        break
        return added

    def fill(self) -> dict[str, Any]:
        """Fills the file system, and keeps it full (whatever the server frees
        is taken back every 0.2 s) until :meth:`drain`."""
        free = self.free_bytes()
        added = self._top_up()
        self._stop.clear()

        def keep_full() -> None:
            while not self._stop.wait(0.2):
                self._top_up()

        self._filler = threading.Thread(target=keep_full, name="ballast", daemon=True)
        self._filler.start()
        return {"free_before_mib": round(free / 2**20, 1), "ballast_mib": round(added / 2**20, 1),
                "free_after_bytes": self.free_bytes()}

    def drain(self) -> None:
        self._stop.set()
        if self._filler is not None:
            self._filler.join(timeout=5)
            self._filler = None
        try:
            self.ballast.unlink()
        except FileNotFoundError:
            pass

    def unmount(self) -> None:
        """Idempotent; lazily (``-l``) if something still holds it open."""
        if not self.mounted:
            return
        self.drain()
        r = subprocess.run(["umount", str(self.path)], capture_output=True)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        self.mounted = False


def stall_put(http: str, path: str, length: int, sent: int, give_up_s: float) -> dict[str, Any]:
    """Opens ``PUT path`` on ``http`` (``host:port``) announcing ``length``
    bytes, sends ``sent`` of them, then sends nothing and waits at most
    ``give_up_s`` for the server to close the connection. Returns what
    happened: ``closed_after_s`` (``None``: still open when it gave up),
    ``status`` (the HTTP status the server answered before closing, if any)."""
    host, port = http.rsplit(":", 1)
    out: dict[str, Any] = {"length": length, "sent": 0, "closed_after_s": None, "status": None, "error": None}
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
    except OSError as e:
        out["error"] = f"connect: {e}"
        return out
    try:
        s.sendall(f"PUT {path} HTTP/1.1\r\nHost: {http}\r\nContent-Length: {length}\r\n\r\n".encode())
        block = os.urandom(1 << 16)
        while out["sent"] < sent:
            n = min(len(block), sent - out["sent"])
            s.sendall(block[:n])
            out["sent"] += n
        t0 = time.monotonic()
        reply = b""
        while True:
            left = give_up_s - (time.monotonic() - t0)
            if left <= 0:
                break
            s.settimeout(left)
            try:
                data = s.recv(4096)
            except socket.timeout:
                break
            except OSError:  # reset: closed too
                data = b""
            if not data:
                out["closed_after_s"] = round(time.monotonic() - t0, 3)
                break
            reply += data
        if reply.startswith(b"HTTP/1."):
            out["status"] = int(reply.split(b" ", 2)[1])
    except OSError as e:
        out["error"] = str(e)
    finally:
        s.close()
    return out
