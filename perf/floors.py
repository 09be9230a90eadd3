"""The floors a load is measured against, in the same run: one
single-thread memcpy of the same bytes between two buffers already mapped,
and the same bytes over one loopback TCP stream (the link a TCP client's
load crosses on this host). Each returns seconds."""
from __future__ import annotations

import ctypes
import socket
import threading
import time

__all__ = ["memcpy", "tcp_loopback"]


def memcpy(nbytes: int, src: bytearray, dst: bytearray) -> float:
    """One ``ctypes.memmove`` of ``nbytes`` from ``src`` into ``dst``."""
    s = (ctypes.c_char * nbytes).from_buffer(src)
    d = (ctypes.c_char * nbytes).from_buffer(dst)
    t = time.perf_counter()
    ctypes.memmove(d, s, nbytes)
    return time.perf_counter() - t


def tcp_loopback(nbytes: int, src: bytearray, dst: bytearray) -> float:
    """``nbytes`` of ``src`` sent over one 127.0.0.1 connection by a thread
    and received into ``dst`` by this one."""
    with socket.create_server(("127.0.0.1", 0)) as ls:
        tx = socket.create_connection(ls.getsockname())
        rx, _ = ls.accept()
    view, into = memoryview(src)[:nbytes], memoryview(dst)[:nbytes]
    sender = threading.Thread(target=tx.sendall, args=(view,))
    t = time.perf_counter()
    sender.start()
    got = 0
    while got < nbytes:
        n = rx.recv_into(into[got:])
        if n == 0:
            raise RuntimeError("loopback connection closed early")
        got += n
    took = time.perf_counter() - t
    sender.join()
    tx.close()
    rx.close()
    return took
