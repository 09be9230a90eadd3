"""Power cuts for tests, the way LazyFS tests databases.

``fs.py`` (next to this file; its docstring is the model) is a FUSE file
system that passes every call through to a backing directory and, when it is
unmounted, throws away whatever was not made durable by ``fsync`` /
``fdatasync`` (file data) and directory ``fsync`` (names created, renamed or
removed). This module runs it for a test::

    fs = PowercutMount(tmp_path / "fs", tmp_path / "mnt")
    fs.mount()                 # the backing directory, as of now, is durable
    ...                        # a program writes under fs.mnt; SIGKILL it
    report = fs.power_off()    # unmount: unsynced state is gone
    fs.mount()                 # boot again from what was durable

``report`` says what the cut threw away (``lost_names``: paths that existed
but were not durable; ``reverted_files``: files whose newest data was not;
``resurrected_names``: removals that were not durable).

Needs root (or a setuid ``fusermount3``), ``/dev/fuse``, libfuse 3
(Debian: ``fuse3``) and the ``mfusepy`` package; :func:`missing` says which
are missing.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

FS_PY = Path(__file__).resolve().parent / "fs.py"


def missing() -> list[str]:
    """What this machine lacks to mount the file system (empty: nothing)."""
    out = []
    if not os.path.exists("/dev/fuse"):
        out.append("/dev/fuse")
    if shutil.which("fusermount3") is None:
        out.append("fusermount3 (Debian package fuse3)")
    r = subprocess.run([sys.executable, "-c", "import mfusepy"], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        out.append(f"libfuse 3 / mfusepy ({last}; python/requirements-dev.txt, Debian package fuse3)")
    if os.geteuid() != 0:
        out.append("root (to mount)")
    return out


def _mounted(mnt: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(mnt) for line in f)


class PowercutMount:
    """One powercut file system: ``work`` holds its state, ``mnt`` is where it is mounted."""

    def __init__(self, work: Path, mnt: Path) -> None:
        self.work = Path(work).resolve()
        self.mnt = Path(mnt).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.log = self.work / "fs.log"
        self.cuts: list[dict] = []

    def mount(self, timeout: float = 30.0) -> None:
        """Starts the daemon and waits (probing the mount table) until it serves ``mnt``."""
        assert self.proc is None, "already mounted"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, str(FS_PY), str(self.work), str(self.mnt)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while not _mounted(self.mnt):
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"the powercut file system exited before it mounted:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the powercut file system did not mount within {timeout}s:\n{self.log_tail()}")
            time.sleep(0.01)

    def power_off(self, timeout: float = 60.0) -> dict:
        """Unmounts (everything using it must be gone) and waits until the
        daemon has rolled the backing directory back to its durable state;
        returns the daemon's report of what was lost."""
        assert self.proc is not None, "not mounted"
        proc, self.proc = self.proc, None
        r = subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            proc.kill()
            proc.wait()
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)
            raise RuntimeError(f"fusermount3 -u {self.mnt} failed: {r.stderr}")
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the powercut daemon did not finish its power cut in {timeout}s") from None
        report = self.work / "poweroff.json"
        if rc != 0 or not report.is_file():
            raise RuntimeError(f"the power cut failed (daemon exit {rc}):\n{self.log_tail()}")
        out = json.loads(report.read_text())
        self.cuts.append(out)
        return out

    def close(self) -> None:
        """Unmounts if mounted (a last power cut), never raising; for clean-up."""
        if self.proc is None:
            return
        try:
            self.power_off(timeout=20)
        except (RuntimeError, OSError):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""
