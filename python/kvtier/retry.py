"""Retries within one deadline: the client's answer to ``UNAVAILABLE``.

Every ``kvtier.v1`` call is idempotent, so a call that failed ``UNAVAILABLE``
(a restart, a lost connection, a request the server shed) is tried again,
gRPC and data plane alike, as long as the call's one deadline allows. The
pause is the server's retry hint when it sent one (``grpc-retry-pushback-ms``
or the data plane's error frame), jittered above it so the clients it shed
together do not come back together; else exponential backoff with jitter.
gRPC's own retries are off (``channels.py``) so the deadline covers all
attempts. The Rust client does the same (crates/kvtier-client).
"""
from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

import grpc

from .errors import KvtierError

__all__ = ["retrying", "backoff"]

T = TypeVar("T")


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt + 1`` without a server hint:
    between half and all of 20 ms × 2**attempt (at most 1.28 s)."""
    base = 0.020 * (1 << min(attempt, 6))
    return base / 2 + random.uniform(0, base / 2)


def retrying(fn: Callable[[float], T], budget: float, retries: int, retry_shed: bool = True) -> tuple[T, int]:
    """Runs ``fn(remaining_seconds)``, retrying ``UNAVAILABLE`` (a gRPC error
    or a :class:`KvtierError`) up to ``retries`` times within ``budget`` seconds.

    ``retry_shed=False`` fails a request the server shed with a hint at once
    instead of waiting for the hint. Returns the result and the end-to-end
    time in microseconds; raises the last error as a :class:`KvtierError`,
    or ``DEADLINE_EXCEEDED`` when no time is left.
    """
    if budget <= 0:
        raise ValueError("timeout must be > 0")
    start = time.monotonic()
    deadline = start + budget
    attempt = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KvtierError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {budget}s")
        try:
            r = fn(remaining)
            return r, int((time.monotonic() - start) * 1e6)
        except grpc.RpcError as e:
            err = KvtierError.from_rpc(e)  # keeps e as its __cause__
        except KvtierError as e:
            err = e
        if err.code == grpc.StatusCode.UNAVAILABLE and attempt < retries:
            # The server's hint when it gave one (it knows when its limit
            # will have moved), jittered above it.
            hint = err.retry_after
            if hint is not None and not retry_shed:
                raise err
            pause = hint * random.uniform(1.0, 1.5) if hint is not None else backoff(attempt)
            if time.monotonic() + pause < deadline:
                time.sleep(pause)
                attempt += 1
                continue
        raise err
