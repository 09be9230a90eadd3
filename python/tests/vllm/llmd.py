"""llm-d's KV-cache indexer as a test oracle: builds ``tools/llmd-check``
(llm-d-kv-cache's own event pool, ZMQ subscriber, token processor and
in-memory index, see its README) into ``.tools/bin/llmd-check``, runs it
subscribed to some KV-event publishers, and asks it what llm-d believes each
pod holds.

Nothing here knows the wire format: whatever publishes (vLLM's own publisher
in test_llmd_check.py, kvtier later) is judged by llm-d's decoding, not ours.
"""
from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvtier.server import REPO_ROOT

if str(REPO_ROOT) not in sys.path:  # perf/ (the Go tool builder) lives at the root
    sys.path.insert(0, str(REPO_ROOT))
from perf import gotools


def build() -> Path:
    """tools/llmd-check, built when missing or stale (perf/gotools.py)."""
    try:
        return gotools.build("llmd-check")
    except gotools.GoToolError as e:
        # A missing tool fails, never skips: a skipped oracle reads as a pass.
        pytest.fail(str(e))


def int64_hash(*parts: str | bytes) -> int:
    """A block hash the way kvtier makes one: the first 8 bytes (big-endian)
    of sha256 over the parts joined by 0x00, as a SIGNED int64. Random 64-bit
    values are what llm-d needs: it rejects hashes that msgpack encodes as
    small ints (see tools/llmd-check/README.md), which such values almost
    never are; is_wide() checks it."""
    digest = hashlib.sha256(b"\x00".join(p.encode() if isinstance(p, str) else p for p in parts)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def is_wide(h: int) -> bool:
    """Whether a minimal msgpack encoder (msgspec, vLLM's) writes ``h`` as a
    64-bit int, the only integer widths llm-d v0.9.0 decodes as a hash:
    non-negative values from 2**32 up (uint64), negative ones below -2**31 (int64)."""
    return h >= 2**32 or h < -(2**31)


class LlmdCheck:
    """One llmd-check process subscribed (SUB connecting) to ``endpoints``.

    Use as a context manager; ``log`` holds its stderr (llm-d's own log lines,
    among them why it dropped an event)."""

    def __init__(self, endpoints: list[str], block_size: int, *extra: str, log: Path | None = None,
                 timeout: float = 10.0):
        binary = build()
        if log is None:
            fd, name = tempfile.mkstemp(prefix="llmd-check-", suffix=".log")
            os.close(fd)
            log = Path(name)
        self.log = log
        self.timeout = timeout
        self._stderr = open(log, "w")
        args = [str(binary), "--block-size", str(block_size), *extra]
        for ep in endpoints:
            args += ["--endpoint", ep]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, bufsize=1)
        self.request({"op": "ping"})  # started and reading stdin (not yet: subscribed, see wait_for)

    def __enter__(self) -> LlmdCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Sends one request line and reads its one-line answer; fails on an
        ``error`` answer, a dead process or a reply later than ``timeout``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is not None:
            pytest.fail(f"llmd-check exited ({self.proc.returncode}); log tail:\n{self.log_tail()}")
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        # One reply per request, so nothing is ever left in the reader's
        # buffer between calls and select() on the pipe is a sound timeout.
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            pytest.fail(f"llmd-check gave no answer to {req['op']} within {self.timeout}s; log tail:\n{self.log_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            pytest.fail(f"llmd-check: {req['op']}: {reply['error']}")
        return reply

    def lookup(self, model: str, tokens: list[int]) -> dict[str, Any]:
        """``{"keys": n, "pods": {pod: {tier: leading blocks}}, "leading":
        {pod: leading blocks in any tier}, "held": {pod: {tier: [block indices]}}}``."""
        return self.request({"op": "lookup", "model": model, "tokens": list(tokens)})

    def score(self, model: str, tokens: list[int], pods: list[str] | None = None) -> dict[str, float]:
        """llm-d's LongestPrefix scorer: ``{pod: score}`` (tier weights applied)."""
        return self.request({"op": "score", "model": model, "tokens": list(tokens), "pods": pods or []})["scores"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op":"quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05,
             describe: Callable[[], Any] | None = None) -> Any:
    """Polls ``predicate`` until it returns something truthy, and returns
    that; fails after ``timeout`` seconds, showing ``describe()`` (the state
    last seen) when given. Events are indexed asynchronously, so every check
    of what llm-d holds after a publish goes through here."""
    end = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > end:
            seen = f"; last seen: {describe()}" if describe else ""
            pytest.fail(f"not true within {timeout}s{seen}")
        time.sleep(interval)
