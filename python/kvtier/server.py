"""Starts the real ``kvtier`` binary for tests and examples.

>>> from kvtier.server import Server
>>> with Server.start(args=["--max-block-size", "1MiB"]) as s:   # doctest: +SKIP
...     client = Client(s.grpc)
...     ...

The server is started as ``kvtier serve --listen 127.0.0.1:0 --http-listen
127.0.0.1:0 --ready-json`` and is ready once it prints its bound addresses as
one JSON line (``{"grpc": [addr, ...], "http": addr, "pid": N}``).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import Error

__all__ = ["Server", "ServerError", "find_binary", "free_port_pair", "free_port_pairs", "REPO_ROOT"]

#: The repository root when running from a source checkout (python/kvtier/..).
REPO_ROOT = Path(__file__).resolve().parent.parent.parent


class ServerError(Error, RuntimeError):
    """The server could not be started or stopped."""


def find_binary() -> Path:
    """``$KVTIER_BIN``, else the newest of target/{debug,release}/kvtier
    (under ``$CARGO_TARGET_DIR`` if set, else the repository's target/)."""
    env = os.environ.get("KVTIER_BIN")
    if env:
        p = Path(env)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise ServerError(f"KVTIER_BIN={env} is not an executable file")
        return p
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO_ROOT / "target")
    found = [p for p in (target / "debug" / "kvtier", target / "release" / "kvtier") if p.is_file()]
    if not found:
        raise ServerError(
            f"no kvtier binary in {target}/debug or {target}/release: run `cargo build -p kvtier` "
            "or set KVTIER_BIN"
        )
    return max(found, key=lambda p: p.stat().st_mtime)


class Server:
    """A running ``kvtier serve`` child process. Use :meth:`start`."""

    def __init__(self, proc: subprocess.Popen, ready: dict, stderr_file, binary: Path):
        self.proc = proc
        self.ready = ready
        self.binary = binary
        self._stderr = stderr_file
        grpc_addrs = ready.get("grpc") or []
        if not grpc_addrs:
            raise ServerError(f"ready line has no gRPC address: {ready}")
        self.grpc_addrs: list[str] = list(grpc_addrs)
        #: First gRPC address, ``host:port``.
        self.grpc: str = self.grpc_addrs[0]
        #: HTTP address ``host:port``, or ``None`` when HTTP is disabled.
        self.http: str | None = ready.get("http")
        self.pid: int = proc.pid
        self.returncode: int | None = None
        # Keep draining stdout so the server never blocks on a full pipe.
        self._drain = threading.Thread(target=self._drain_stdout, daemon=True)
        self._drain.start()

    @classmethod
    def start(
        cls,
        binary: str | os.PathLike | None = None,
        args: Sequence[str] = (),
        timeout: float = 60.0,
        env: dict | None = None,
        listen: str = "127.0.0.1:0",
        cpus: Iterable[int] | None = None,
    ) -> Server:
        """Starts the server and waits (at most ``timeout`` seconds) until it is listening.

        ``args`` are extra ``serve`` flags, e.g. ``["--max-block-size", "1MiB"]``;
        ``listen`` the gRPC address (default: an ephemeral loopback port).
        ``cpus``: start the server pinned to these CPUs. It sizes its runtime
        (one worker per CPU) from the CPUs it may use at start, so it must be
        started pinned: pinning a running server leaves all its workers on
        fewer cores (notes/028, docs/operations.md "CPU pinning").
        """
        bin_path = Path(binary) if binary is not None else find_binary()
        cmd = [
            str(bin_path), "serve",
            "--listen", listen,
            "--http-listen", "127.0.0.1:0",
            "--ready-json",
            *map(str, args),
        ]
        stderr = tempfile.TemporaryFile()
        # The child inherits the calling thread's affinity at fork.
        restore = os.sched_getaffinity(0) if cpus is not None else None
        if cpus is not None:
            cpus = list(cpus)
            try:
                os.sched_setaffinity(0, cpus)
            except (OSError, ValueError, TypeError) as e:
                stderr.close()
                raise ServerError(f"cannot pin the server to CPUs {cpus}: {e}") from e
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
            )
        except OSError as e:
            stderr.close()
            raise ServerError(f"cannot run {bin_path}: {e}") from e
        finally:
            if restore is not None:
                os.sched_setaffinity(0, restore)
        try:
            line = cls._read_ready_line(proc, timeout)
            try:
                ready = json.loads(line)
            except ValueError as e:
                raise ServerError(f"ready line is not JSON: {line!r}") from e
            if ready.get("pid") not in (None, proc.pid):
                raise ServerError(f"ready line names pid {ready.get('pid')}, but the child is {proc.pid}")
            return cls(proc, ready, stderr, bin_path)
        except BaseException as e:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            stderr.seek(0)
            tail = stderr.read()[-4000:].decode("utf-8", "replace")
            stderr.close()
            if proc.stdout:
                proc.stdout.close()
            if isinstance(e, ServerError):
                raise ServerError(f"{e}\n$ {' '.join(cmd)}\nexit code: {proc.returncode}\nstderr:\n{tail}") from None
            raise

    @staticmethod
    def _read_ready_line(proc: subprocess.Popen, timeout: float) -> str:
        """Reads stdout up to the first newline, bounded by ``timeout``; fails early if the process exits."""
        assert proc.stdout is not None, "started with stdout=PIPE"
        fd = proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerError(f"no ready line within {timeout}s (got {buf!r})")
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:  # EOF: the process exited (or closed stdout)
                    proc.wait(timeout=10)
                    raise ServerError(f"server exited before it was ready (got {buf!r})")
                buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    def _drain_stdout(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None, "started with stdout=PIPE"
        try:
            while stdout.read(65536):
                pass
        except (OSError, ValueError):
            pass

    def stderr_text(self) -> str:
        """What the server wrote to stderr so far (its logs)."""
        if self._stderr.closed:
            return ""
        # pread: the child shares this file's offset, so never seek it.
        fd = self._stderr.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM to this server's own PID, then waits at most ``timeout`` seconds.

        Returns the exit code (0 for a graceful shutdown). If it does not exit in
        time it is killed and :class:`ServerError` is raised.
        """
        if self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                self._close()
                self.returncode = self.proc.returncode
                raise ServerError(
                    f"kvtier (pid {self.proc.pid}) did not stop within {timeout}s of SIGTERM; killed"
                ) from None
        self.returncode = self.proc.returncode
        self._close()
        return self.returncode

    def _close(self) -> None:
        self._drain.join(timeout=5)
        if self.proc.stdout:
            self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Server(pid={self.pid}, grpc={self.grpc!r}, http={self.http!r})"


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port P such that P and P + 1 are free on ``host`` now: where a server
    started with ``listen=f"{host}:{P}"`` puts its gRPC listener and its data
    plane (``data_listen = "auto"``). For tests that need a fixed address (a
    server restarted at the same place); another process may still take it."""
    import socket

    for _ in range(100):
        with socket.socket() as a:
            a.bind((host, 0))
            port = a.getsockname()[1]
            try:
                with socket.socket() as b:
                    b.bind((host, port + 1))
            except OSError:
                continue
            return port
    raise ServerError("no free pair of adjacent ports")


def free_port_pairs(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` ports as :func:`free_port_pair` gives them, no two pairs
    overlapping: for ``n`` servers each at a fixed address (a cluster's
    node list)."""
    ports: list[int] = []
    for _ in range(100 * n):
        if len(ports) == n:
            break
        p = free_port_pair(host)
        if all(abs(p - q) > 1 for q in ports):
            ports.append(p)
    if len(ports) < n:
        raise ServerError(f"no {n} free pairs of adjacent ports")
    return ports
