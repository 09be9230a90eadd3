"""Client of kvtier's bulk data plane (``docs/wire.md``), mirroring crates/kvtier-client/src/wire.rs.

``Read`` and ``Write`` payloads travel as raw bytes after a 24-byte header and
a small protobuf, over a pool of plain TCP connections with one request in
flight each. :class:`kvtier.Client` uses it automatically when the server
advertises a data-plane address (``Stats.data_listen``).

How the bytes move, and why:

* Sockets are *blocking*, with the call's remaining time set as
  ``SO_RCVTIMEO`` / ``SO_SNDTIMEO`` before every system call. A payload is
  then received with one ``recv(n, MSG_WAITALL)`` straight into a new
  ``bytes`` object: one kernel copy, no Python-level reassembly, no second
  copy from a ``bytearray``. (Python's own ``settimeout`` makes the socket
  non-blocking, and ``MSG_WAITALL`` means nothing there.)
* A request goes out with ``sendmsg`` of header, metadata and the callers'
  payload buffers: no concatenation.
* TCP congestion control: the system default unless ``congestion`` names one,
  as the Rust client and the server do (``reno`` avoids BBR's pacing of a
  1.2 MB burst on low-RTT links; ``notes/006-data-plane.md``).
* Long reads are striped: :meth:`kvtier.Client.read` cuts them into
  contiguous runs (:meth:`WirePool.stripes_for`, :func:`stripe_bounds`, the
  Rust client's rules) read at once on separate connections
  (:meth:`WirePool.parallel`), because one TCP stream's window caps a long
  prefix across a real round-trip time (docs/wire.md, notes/020).

Errors: transport failures and protocol violations raise
``KvtierError(UNAVAILABLE)`` (the client retries those) and the connection is
dropped; the server's Error frames raise its status; a call past its deadline
raises ``DEADLINE_EXCEEDED``.
"""
from __future__ import annotations

import itertools
import os
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TypeVar

import grpc

from ._error import Error
from .errors import KvtierError, status_code, wire_pushback

__all__ = [
    "WirePool", "HEADER", "MAGIC", "SIZE", "Kind", "parse_addr", "STRIPE_MIN_BLOCKS", "MAX_STRIPES", "stripe_bounds",
]

T = TypeVar("T")

#: magic, kind, flags, reserved, request id, meta_len, data_len (little-endian).
HEADER = struct.Struct("<4sBBHQII")
MAGIC = b"KVW1"
#: ``ReadDone.reason`` of a read reply that reached its size limit (the client continues).
SIZE = "size"
#: Fewest keys per stripe: shorter reads are not split (a stripe costs a
#: request and a connection). The Rust client's ``wire::STRIPE_MIN_BLOCKS``.
STRIPE_MIN_BLOCKS = 8
#: Most stripes per read by default (the Rust client's ``wire::MAX_STRIPES``).
MAX_STRIPES = 8
_U32_MAX = 0xFFFF_FFFF
_TIMEVAL = struct.Struct("@ll")
_TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))
except (ValueError, OSError, AttributeError):  # pragma: no cover
    _IOV_MAX = 1024


class Kind:
    """Frame kinds."""

    READ = 1
    WRITE = 2
    HELLO = 3
    READ_REPLY = 0x81
    WRITE_REPLY = 0x82
    HELLO_REPLY = 0x83
    ERROR = 0xFF


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` into ``(host, port)``; ``ValueError`` otherwise."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{addr!r} is not host:port")
    return host.strip("[]"), int(port)


def stripe_bounds(n: int, stripes: int) -> list[range]:
    """``n`` keys cut into ``stripes`` contiguous runs whose lengths differ by at most 1
    (the longer ones first), as the Rust client cuts them."""
    q, r = divmod(n, stripes)
    out, start = [], 0
    for i in range(stripes):
        end = start + q + (1 if i < r else 0)
        out.append(range(start, end))
        start = end
    return out


class _Deadline:
    __slots__ = ("at",)

    def __init__(self, seconds: float):
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()


class _Expired(Exception):
    """The call's deadline passed during a socket operation."""


class WirePool:
    """A thread-safe pool of data-plane connections to ``addr``.

    :param addr: ``(host, port)`` of the server's data plane.
    :param connections: at most this many requests in flight (one per connection).
    :param congestion: TCP congestion control for new connections (``None`` or
        ``""``: the system default). A name the kernel refuses is ignored.
    :param max_reply: largest reply frame accepted (metadata + payloads).
    :param tls: an ``ssl.SSLContext`` for servers with TLS on (docs/security.md);
        ``server_hostname`` is the name (or IP address) their certificate carries.
    :param max_stripes: most connections one long read is striped over
        (:meth:`stripes_for`; 1: never split).
    """

    def __init__(
        self,
        addr: tuple[str, int],
        connections: int = 4,
        congestion: str | None = None,
        max_reply: int = 512 << 20,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        max_stripes: int = MAX_STRIPES,
    ):
        if connections < 1:
            raise ValueError("connections must be >= 1")
        if max_stripes < 1:
            raise ValueError("max_stripes must be >= 1")
        from ._proto import load

        m = load()
        self._v1, self._w = m.v1, m.wire
        self.addr = addr
        self.congestion = congestion or None
        self.max_reply = max_reply
        self.token = token or None
        self.tls = tls
        self.server_hostname = server_hostname or addr[0]
        self.connections = connections
        self.max_stripes = max_stripes
        self._ids = itertools.count(1)
        self._closed = False
        self._reset()
        #: Connections opened so far (a test and diagnostics aid).
        self.dials = 0

    def _reset(self) -> None:
        """Fresh pool state for this process. After ``fork`` the child must not
        share the parent's connections (their frames would interleave), and a
        lock or slot a parent thread held at the fork would never be released."""
        self._pid = os.getpid()
        self._slots = threading.BoundedSemaphore(self.connections)
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = []
        # Threads for the stripes of long reads (made on first use; a
        # parent's are dead in a forked child, so it makes its own).
        self._stripers: ThreadPoolExecutor | None = None

    def _after_fork(self) -> None:
        """In a forked child: close its copies of the parent's descriptors
        (close, never shutdown: that would cut the parent's connections) and
        start afresh."""
        if self._pid != os.getpid():
            for s in self._idle:
                s.close()
            self._reset()

    def __repr__(self) -> str:
        return f"WirePool({self.addr[0]}:{self.addr[1]}, connections={self.connections})"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stripers, self._stripers = self._stripers, None
        self._drop_idle()
        if stripers is not None and self._pid == os.getpid():
            stripers.shutdown(wait=False)

    # -- striping -------------------------------------------------------------

    def stripes_for(self, blocks: int) -> int:
        """How many stripes a read of ``blocks`` keys is split into: one per
        :data:`STRIPE_MIN_BLOCKS` keys, at most one per pooled connection and
        at most ``max_stripes`` (the Rust client's ``WireClient::stripes_for``)."""
        return max(1, min(blocks // STRIPE_MIN_BLOCKS, self.connections, self.max_stripes))

    def parallel(self, fns: Sequence[Callable[[], T]]) -> list[tuple[T | None, BaseException | None]]:
        """Runs ``fns`` at once, the first on the calling thread and the others
        on this pool's stripe threads, and returns each one's ``(result,
        None)`` or ``(None, exception)`` in order. It returns only when all
        of them have finished, since they may be writing into the caller's
        buffers. The threads are at most ``connections``, as the requests in
        flight are: more could only wait for a connection."""
        self._after_fork()
        with self._lock:
            if self._closed:
                raise ValueError("client is closed")
            if self._stripers is None:
                self._stripers = ThreadPoolExecutor(self.connections, thread_name_prefix="kvtier-stripe")
            others = [self._stripers.submit(f) for f in fns[1:]]
        out: list[tuple[T | None, BaseException | None]] = []
        try:
            out.append((fns[0](), None))
        except Exception as e:  # noqa: BLE001 - handed to the caller, in order
            out.append((None, e))
        finally:  # an interrupt too waits for the others before it propagates
            wait(others)
        for f in others:
            err = f.exception()
            out.append((None, err) if err is not None else (f.result(), None))
        return out

    def _drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()

    # -- calls --------------------------------------------------------------

    def read(self, namespace: str, keys: Sequence[bytes], lease_id: int, timeout: float, into=None):
        """One Read: returns ``(WireReadReply, payloads)``; payload i belongs to block i.

        Checksums are the caller's to verify (``Block.crc32c`` of each block).
        The reply is at most ``max_reply`` bytes: a longer read ends early with
        reason :data:`SIZE` (see :meth:`kvtier.Client.read`, which continues it).
        ``into(i, nbytes)`` may return a writable buffer of at least ``nbytes``
        for payload ``i``: the payload is received straight into it (no copy)
        and returned as a memoryview of it; ``None`` keeps the default (a new
        ``bytes``).
        """
        req = self._w.WireReadRequest(
            request=self._v1.ReadRequest(namespace=namespace, keys=keys, lease_id=lease_id),
            # The server stops at 90% of our deadline so that its partial
            # answer arrives before we give up.
            timeout_ms=_server_ms(timeout),
            max_reply_bytes=self.max_reply,
        )
        f = self._call(Kind.READ, req.SerializeToString(), (), 0, timeout, Kind.READ_REPLY, into)
        return f.read_reply, f.payloads

    def write(self, namespace: str, blocks: Sequence, payloads: Sequence, timeout: float):
        """One Write of ``blocks`` (protobuf ``Block``s without payloads) and their ``payloads``
        (any contiguous buffers, or tuples of buffers that form one payload; lengths are in bytes)."""
        lengths = [sum(memoryview(x).nbytes for x in p) if isinstance(p, tuple) else memoryview(p).nbytes
                   for p in payloads]
        total = sum(lengths)
        if total > _U32_MAX:
            raise KvtierError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a data-plane write carries at most {_U32_MAX} bytes, this one {total}: split the batch",
            )
        req = self._w.WireWriteRequest(
            request=self._v1.WriteRequest(namespace=namespace, blocks=blocks),
            payload_lengths=lengths,
            timeout_ms=_server_ms(timeout),
        )
        flat = [x for p in payloads for x in (p if isinstance(p, tuple) else (p,))]
        f = self._call(Kind.WRITE, req.SerializeToString(), flat, total, timeout, Kind.WRITE_REPLY)
        return self._v1.WriteResponse.FromString(f.meta)

    # -- plumbing -------------------------------------------------------------

    def _call(
        self, kind: int, meta: bytes, payloads: Sequence, data_len: int, timeout: float, reply_kind: int, into=None
    ) -> _Frame:
        deadline = _Deadline(timeout)
        self._after_fork()
        if not self._slots.acquire(timeout=max(0.0, deadline.remaining())):
            raise self._deadline_error(timeout)
        try:
            sock = self._take(deadline, timeout)
            rid = next(self._ids) & 0xFFFF_FFFF_FFFF_FFFF
            try:
                reply = self._exchange(sock, kind, rid, meta, payloads, data_len, deadline, into)
            except _Expired:
                sock.close()
                raise self._deadline_error(timeout) from None
            except BufferTooSmall:
                sock.close()  # the rest of the reply is still on the wire
                raise
            except (OSError, ValueError) as e:
                # The connection's state is unknown: drop it. A transport
                # failure usually means the server restarted or went away, so
                # the idle connections are dropped too and a retry dials fresh.
                sock.close()
                self._drop_idle()
                raise KvtierError(grpc.StatusCode.UNAVAILABLE, f"data plane {self._name()}: {e}") from e
            except BaseException:
                sock.close()
                raise
            if reply.kind == Kind.ERROR:
                # Some Error frames close the connection on the server's side
                # (bad framing); errors are rare, so never reuse after one.
                sock.close()
                err = self._w.WireError.FromString(reply.meta)
                raise KvtierError(status_code(err.code), err.message, wire_pushback(err.retry_pushback_ms))
            self._give_back(sock)
            if reply.kind != reply_kind:
                raise KvtierError(
                    grpc.StatusCode.INTERNAL,
                    f"data plane {self._name()} answered frame kind {reply.kind:#04x}, expected {reply_kind:#04x}",
                )
            return reply
        finally:
            self._slots.release()

    def _name(self) -> str:
        return f"{self.addr[0]}:{self.addr[1]}"

    def _deadline_error(self, timeout: float) -> KvtierError:
        return KvtierError(
            grpc.StatusCode.DEADLINE_EXCEEDED, f"data plane {self._name()}: no answer within {timeout:g}s"
        )

    def _take(self, deadline: _Deadline, timeout: float) -> socket.socket:
        with self._lock:
            if self._closed:
                raise ValueError("client is closed")
            if self._idle:
                return self._idle.pop()
        remaining = deadline.remaining()
        if remaining <= 0:
            raise self._deadline_error(timeout)
        try:
            s = socket.create_connection(self.addr, timeout=remaining)
        except socket.timeout:
            raise self._deadline_error(timeout) from None
        except OSError as e:
            raise KvtierError(grpc.StatusCode.UNAVAILABLE, f"data plane {self._name()}: {e}") from e
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.congestion:
            try:
                s.setsockopt(socket.IPPROTO_TCP, _TCP_CONGESTION, self.congestion.encode())
            except OSError:
                pass  # best effort: only the pacing differs
        if self.tls is not None:
            # The handshake runs under the socket's timeout (the time left);
            # afterwards deadlines are socket timeouts (see _arm).
            try:
                s = self.tls.wrap_socket(s, server_hostname=self.server_hostname)
            except (OSError, ValueError) as e:
                s.close()
                raise KvtierError(grpc.StatusCode.UNAVAILABLE, f"data plane {self._name()}: TLS: {e}") from e
        else:
            s.settimeout(None)  # blocking; deadlines via SO_RCVTIMEO / SO_SNDTIMEO
        with self._lock:
            self.dials += 1
        if self.token:
            self._hello(s, deadline, timeout)
        return s

    def _hello(self, s: socket.socket, deadline: _Deadline, timeout: float) -> None:
        """Authenticates a new connection (a Hello frame, docs/wire.md)."""
        meta = self._w.WireHello(token=self.token).SerializeToString()
        try:
            f = self._exchange(s, Kind.HELLO, 0, meta, (), 0, deadline)
        except _Expired:
            s.close()
            raise self._deadline_error(timeout) from None
        except (OSError, ValueError) as e:
            s.close()
            raise KvtierError(grpc.StatusCode.UNAVAILABLE, f"data plane {self._name()}: {e}") from e
        if f.kind == Kind.ERROR:
            s.close()
            err = self._w.WireError.FromString(f.meta)
            raise KvtierError(status_code(err.code), err.message)
        if f.kind != Kind.HELLO_REPLY:
            s.close()
            raise KvtierError(grpc.StatusCode.INTERNAL, f"data plane {self._name()}: Hello answered with kind {f.kind:#04x}")

    def warm(self, timeout: float) -> None:
        """Opens one connection within ``timeout`` seconds (TCP, TLS, Hello)
        and keeps it for the next call. Raises :class:`KvtierError`:
        ``UNAVAILABLE`` or ``DEADLINE_EXCEEDED`` when the address cannot be
        reached, the server's status when it refuses the Hello."""
        self._after_fork()
        self._give_back(self._take(_Deadline(timeout), timeout))

    def _give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(sock)
                return
        sock.close()

    def _exchange(self, sock, kind, rid, meta, payloads, data_len, deadline, into=None) -> _Frame:
        header = HEADER.pack(MAGIC, kind, 0, 0, rid, len(meta), data_len)
        _send_all(sock, [header, meta, *payloads], deadline)
        raw = _recv_exact(sock, HEADER.size, deadline)
        magic, rkind, _flags, _res, reply_id, meta_len, data_len = HEADER.unpack(raw)
        if magic != MAGIC:
            raise ValueError(f"bad frame magic {magic!r}: not a kvtier data-plane peer")
        if reply_id != rid and rkind != Kind.ERROR:
            raise ValueError(f"reply to request {reply_id} while waiting for {rid}")
        if meta_len + data_len > self.max_reply:
            raise ValueError(f"reply of {meta_len + data_len} bytes exceeds the {self.max_reply}-byte limit")
        m = _recv_exact(sock, meta_len, deadline)
        read_reply = None
        lengths = [data_len]
        if rkind == Kind.READ_REPLY:
            try:
                read_reply = self._w.WireReadReply.FromString(m)
            except Exception as e:  # protobuf's DecodeError
                raise ValueError(f"bad read reply: {e}") from e
            lengths = list(read_reply.payload_lengths)
            if len(lengths) != len(read_reply.blocks):
                raise ValueError(f"read reply has {len(read_reply.blocks)} blocks but {len(lengths)} payloads")
        if sum(lengths) != data_len:
            raise ValueError(f"payload lengths add up to {sum(lengths)} bytes but the frame carries {data_len}")
        out: list[bytes | memoryview | list[memoryview]] = []
        for i, n in enumerate(lengths):
            buf = into(i, n) if into is not None and read_reply is not None else None
            if buf is None:
                out.append(_recv_exact(sock, n, deadline))
                continue
            views = [memoryview(b).cast("B") for b in (buf if isinstance(buf, (list, tuple)) else (buf,))]
            room = sum(v.nbytes for v in views)
            if room < n or any(v.readonly for v in views):
                raise BufferTooSmall(
                    f"buffer for payload {i} holds {room} bytes (writable: {not any(v.readonly for v in views)}), "
                    f"need {n}"
                )
            filled: list[memoryview] = []
            left = n
            for v in views:
                k = min(v.nbytes, left)
                _recv_into_exact(sock, v[:k], deadline)
                filled.append(v[:k])
                left -= k
                if not left:
                    break
            out.append(filled if isinstance(buf, (list, tuple)) else filled[0])
        return _Frame(rkind, m, out, read_reply)


@dataclass
class _Frame:
    kind: int
    meta: bytes
    payloads: list[bytes | memoryview | list[memoryview]]  # bytes, or views of the caller's buffers
    read_reply: object | None


def _server_ms(timeout: float) -> int:
    return max(1, min(_U32_MAX, int(timeout * 900)))


def _arm(sock: socket.socket, opt: int, deadline: _Deadline) -> None:
    """Sets ``opt`` (SO_RCVTIMEO / SO_SNDTIMEO) to the time left; raises ``_Expired`` if none is.
    A TLS socket gets a socket timeout instead (its reads are records, not bytes)."""
    left = deadline.remaining()
    if left <= 0:
        raise _Expired()
    if isinstance(sock, ssl.SSLSocket):
        sock.settimeout(left)
        return
    sec = int(left)
    usec = int((left - sec) * 1e6)
    if sec == 0 and usec == 0:
        usec = 1  # {0, 0} would mean "wait forever"
    sock.setsockopt(socket.SOL_SOCKET, opt, _TIMEVAL.pack(sec, usec))


def _recv_exact(sock: socket.socket, n: int, deadline: _Deadline) -> bytes:
    """Exactly ``n`` bytes, usually with a single ``recv(n, MSG_WAITALL)``."""
    if n == 0:
        return b""
    parts = []
    left = n
    while left:
        _arm(sock, socket.SO_RCVTIMEO, deadline)
        try:
            b = sock.recv(left, _waitall(sock))
        except (BlockingIOError, TimeoutError):  # the timeout fired with nothing received
            continue  # _arm raises _Expired if the deadline is really gone
        if not b:
            raise ConnectionError(f"connection closed with {left} of {n} bytes still to come")
        if len(b) == n:
            return b
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


class BufferTooSmall(Error, ValueError):
    """A ``read(into=...)`` buffer cannot take its payload (the caller's mistake, not retried)."""


def _recv_into_exact(sock: socket.socket, view: memoryview, deadline: _Deadline) -> None:
    """Fills ``view`` exactly, usually with a single ``recv_into(..., MSG_WAITALL)``."""
    pos, n = 0, view.nbytes
    while pos < n:
        _arm(sock, socket.SO_RCVTIMEO, deadline)
        try:
            got = sock.recv_into(view[pos:], n - pos, _waitall(sock))
        except (BlockingIOError, TimeoutError):
            continue
        if got == 0:
            raise ConnectionError(f"connection closed with {n - pos} of {n} bytes still to come")
        pos += got


def _waitall(sock: socket.socket) -> int:
    # TLS sockets take no flags (their reads return what one record holds).
    return 0 if isinstance(sock, ssl.SSLSocket) else socket.MSG_WAITALL


def _send_all(sock: socket.socket, buffers: list, deadline: _Deadline) -> None:
    """Sends every buffer with vectored writes (``sendmsg``), resuming after partial sends."""
    views = [v for v in (memoryview(b).cast("B") for b in buffers) if len(v)]
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg over TLS: one record stream
        for v in views:
            _arm(sock, socket.SO_SNDTIMEO, deadline)
            try:
                sock.sendall(v)
            except TimeoutError:
                raise _Expired() from None
        return
    i = 0
    while i < len(views):
        _arm(sock, socket.SO_SNDTIMEO, deadline)
        try:
            sent = sock.sendmsg(views[i : i + _IOV_MAX])
        except BlockingIOError:
            continue
        while sent:
            n = len(views[i])
            if sent >= n:
                sent -= n
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0
