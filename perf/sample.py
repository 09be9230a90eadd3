"""A process's resident memory and CPU time, from /proc: read once, or
sampled on a thread while a measurement runs.

* CPU seconds: ``utime + stime`` of ``/proc/PID/stat`` over ``SC_CLK_TCK``
  (the process's own threads; its children are not counted);
* resident memory: ``VmRSS`` of ``/proc/PID/status``.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """``VmRSS`` of ``pid`` in MiB (0 when it has none: a zombie)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far, in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces and parentheses: fields
    # after its closing parenthesis start at 3 (state); utime is 14, stime 15.
    rest = stat[stat.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


class Sampler:
    """Samples ``pid``'s RSS every ``interval`` seconds on a thread, between
    ``start()`` and ``stop()`` (or as a context manager), and its CPU time at
    both ends::

        with Sampler(server.pid, 0.02) as s:
            run_load()
        s.result()   # {"rss_before_mib", "rss_peak_mib", "rss_after_mib", "cpu_s", "wall_s", "cpu_utilisation"}
    """

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid = pid
        self.interval = interval
        self.rss_before = self.rss_peak = self.rss_after = 0.0
        self.cpu_before = self.cpu_after = 0.0
        self.t0 = self.t1 = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.rss_peak = max(self.rss_peak, rss_mib(self.pid))
            except OSError:  # the process is gone
                return
            self.samples += 1

    def start(self) -> Sampler:
        self.rss_before = self.rss_peak = rss_mib(self.pid)
        self.cpu_before = cpu_seconds(self.pid)
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.t1 = time.monotonic()
        try:
            self.rss_after = rss_mib(self.pid)
            self.rss_peak = max(self.rss_peak, self.rss_after)
            self.cpu_after = cpu_seconds(self.pid)
        except OSError:
            self.cpu_after = self.cpu_before
        return self.result()

    def result(self) -> dict[str, Any]:
        wall = self.t1 - self.t0
        cpu = self.cpu_after - self.cpu_before
        return {
            "rss_before_mib": round(self.rss_before, 1),
            "rss_peak_mib": round(self.rss_peak, 1),
            "rss_after_mib": round(self.rss_after, 1),
            "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3),
            "cpu_utilisation": round(cpu / wall, 3) if wall > 0 else None,
            "samples": self.samples,
        }

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
