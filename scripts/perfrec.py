"""What the perf-record scripts share: the server's resident memory, and the
record's header (date, commit, whether the tree was dirty, machine, command)
written around the script's own results."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` in MiB (0 when it has none: a zombie)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def write_record(out: str | Path, title: str, script: str, **fields) -> None:
    """Writes the perf record ``out``: the common header, then ``fields``."""
    record = {
        "title": title,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release()},
        "command": shlex.join([f"scripts/{script}", *sys.argv[1:]]),
        **fields,
    }
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
