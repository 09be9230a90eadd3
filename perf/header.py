"""The header every perf record carries, and writing a record with it.

Six top-level keys, read by checks outside this repository's tests, so their
names are fixed:

* ``date``: UTC, ISO 8601, seconds;
* ``commit``: the checkout's HEAD (40 hex digits);
* ``dirty``: whether tracked files differed from ``commit`` when the record
  was written (``null`` in records converted from before it was recorded);
* ``machine``: CPU model, cores, memory, kernel, the system's TCP congestion
  control (and the host name);
* ``command``: the command line exactly as it was executed;
* ``versions``: every tool and peer the measurement used.

For a program that writes its own record and reads its stamp from the
environment (``crates/kvtier-server/examples/object_bench.rs`` reads
``BENCH_*``), ``python3 -m perf.stamp --env [--command CMD]`` prints the
header as shell ``export`` lines (:func:`env_exports`), so no script computes
a stamp by hand; ``python3 -m perf.stamp RECORD`` then completes the record.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: The repository root (perf/..).
ROOT = Path(__file__).resolve().parent.parent

#: The keys every record starts with, in this order.
HEADER_KEYS = ("date", "commit", "dirty", "machine", "command", "versions")

#: The keys of ``machine`` every new record fills (``null`` where unknown).
MACHINE_KEYS = ("cpu_model", "cores", "memory_gib", "kernel", "congestion_control")


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_state() -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it); ``None`` for
    what git cannot tell (no git, not a checkout). A device machine's copy of
    the tree has no .git: there ``$KVTIER_COMMIT`` names the commit (and
    whether it was dirty is not known)."""
    commit = _git("rev-parse", "HEAD")
    if commit is None and os.environ.get("KVTIER_COMMIT"):
        return os.environ["KVTIER_COMMIT"], None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, (None if status is None else bool(status))


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def machine() -> dict[str, Any]:
    """This machine: CPU model, cores (and those this process may use),
    memory, kernel, TCP congestion control, host name."""
    cpuinfo = _read("/proc/cpuinfo") or ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    meminfo = _read("/proc/meminfo") or ""
    mem = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.M)
    memory_bytes = int(mem.group(1)) * 1024 if mem else None
    cc = _read("/proc/sys/net/ipv4/tcp_congestion_control")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu_model": model.group(1).strip() if model else None,
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "memory_gib": round(memory_bytes / 2**30, 1) if memory_bytes else None,
        "memory_bytes": memory_bytes,
        "kernel": platform.release(),
        "congestion_control": cc.strip() if cc else None,
        "hostname": platform.node(),
    }


def command_line(env: Iterable[str] = ()) -> str:
    """The command line as executed (``sys.orig_argv``: the interpreter and
    its options too), after ``NAME=value`` for each variable of ``env`` that
    is set (settings a script reads from the environment)."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    prefix = [f"{k}={os.environ[k]}" for k in env if k in os.environ]
    return shlex.join([*prefix, *argv])


def _first_line(cmd: list[str]) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = (r.stdout or r.stderr).strip()
    return out.splitlines()[0].strip() if r.returncode == 0 and out else None


def tool_version(tool: str, path: str | os.PathLike[str] | None = None) -> str | None:
    """The version of ``tool`` (``None`` when it cannot be run). ``path``:
    the executable (or, for ``mooncake``, its Python) if not the one on PATH.

    Known: ``python``, ``kvtier``, ``redis-server``, ``redis-benchmark``,
    ``minio``, ``azurite``, ``node``, ``mooncake``, ``perf``, ``cc``; any
    other tool answers ``TOOL --version``'s first line."""
    exe = str(path) if path is not None else tool
    if tool == "python":
        return platform.python_version() if path is None else _first_line([exe, "--version"])
    if tool == "kvtier":
        line = _first_line([exe, "--version"])
        return line.split()[-1] if line else None
    if tool in ("redis-server", "redis-benchmark", "redis-cli"):
        line = _first_line([exe, "--version"])
        m = re.search(r"v=(\S+)|(\d+\.\d+\.\d+)", line or "")
        return (m.group(1) or m.group(2)) if m else line
    if tool == "minio":
        if path is None:
            found = [p for p in (os.environ.get("KVTIER_MINIO"), ROOT / ".tools/bin/minio",
                                 Path.home() / "go/bin/minio") if p and Path(p).is_file()]
            exe = str(found[0]) if found else exe
        line = _first_line([exe, "--version"])
        return line.removeprefix("minio version ").strip() if line else None
    if tool == "azurite":
        pkg = Path(path) if path is not None else ROOT / ".tools/azurite/node_modules/azurite/package.json"
        try:
            return str(json.loads(pkg.read_text())["version"])
        except (OSError, ValueError, KeyError):
            return None
    if tool == "mooncake":
        py = exe if path is not None else os.environ.get("KVTIER_MOONCAKE_PYTHON",
                                                             str(ROOT / ".tools/mooncake/bin/python"))
        return _first_line([py, "-c", "import importlib.metadata as m; "
                            "print(m.version('mooncake-transfer-engine-non-cuda'))"])
    if tool == "perf":
        line = _first_line([exe, "--version"])
        return line.split()[-1] if line else None
    return _first_line([exe, "--version"])


def versions(*tools: str, paths: Mapping[str, str | os.PathLike[str]] | None = None,
             known: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """``{tool: version}`` for Python and each of ``tools`` (see
    :func:`tool_version`; ``paths`` names executables not on PATH), plus
    ``known`` versions the caller already has (a peer's own report)."""
    paths = paths or {}
    out: dict[str, str | None] = {"python": platform.python_version()}
    for t in tools:
        out[t] = tool_version(t, paths.get(t))
    out.update(known or {})
    return out


def packages(*names: str) -> dict[str, str | None]:
    """``{package: version}`` of installed Python distributions (``None``: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def header(command: str | None = None, versions: Mapping[str, str | None] | None = None,
           env: Iterable[str] = ()) -> dict[str, Any]:
    """The six header keys, measured now. ``command``: what was executed, if
    not this process's own command line (a shell script's, say);
    ``versions``: from :func:`versions` (Python's alone if not given)."""
    commit, dirty = git_state()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "machine": machine(),
        "command": command if command is not None else command_line(env),
        "versions": dict(versions) if versions is not None else {"python": platform.python_version()},
    }


def record(fields: Mapping[str, Any], head: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A record: ``head`` (default: :func:`header` now) then ``fields``, which
    may not carry a header key of their own."""
    clash = sorted(set(fields) & set(HEADER_KEYS))
    if clash:
        raise ValueError(f"record fields {clash} would replace the header's")
    head = dict(head) if head is not None else header()
    missing = [k for k in HEADER_KEYS if k not in head]
    if missing:
        raise ValueError(f"header lacks {missing}")
    return {**{k: head[k] for k in HEADER_KEYS}, **fields}


def write_record(path: str | os.PathLike[str], fields: Mapping[str, Any],
                 head: Mapping[str, Any] | None = None, indent: int = 1) -> dict[str, Any]:
    """Writes :func:`record` as JSON to ``path`` (parents created) and returns it."""
    rec = record(fields, head)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(rec, indent=indent) + "\n")
    print(f"wrote {p}", flush=True)
    return rec


def stamp(rec: Mapping[str, Any], head: Mapping[str, Any]) -> dict[str, Any]:
    """Another tool's record (``kvtier bench``'s, say) with the header keys it
    lacks taken from ``head``, first; every field it has is kept."""
    out = {k: rec[k] if k in rec else head[k] for k in HEADER_KEYS}
    out.update({k: v for k, v in rec.items() if k not in out})
    return out


def stamp_file(path: str | os.PathLike[str], head: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Rewrites the JSON record at ``path`` through :func:`stamp`."""
    p = Path(path)
    rec = stamp(json.loads(p.read_text()), head if head is not None else header())
    p.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def env_exports(head: Mapping[str, Any]) -> list[str]:
    """``head`` as the ``export BENCH_*=...`` lines a program that writes its
    own record reads (date; commit with ``-dirty`` when the tree differed, as
    perf.migrate reads it back; the machine as one line of the form
    perf.migrate parses; the command)."""
    m = head["machine"]
    values = {
        "BENCH_DATE": head["date"],
        "BENCH_COMMIT": f"{head['commit'] or 'unknown'}{'-dirty' if head['dirty'] else ''}",
        "BENCH_MACHINE": f"{platform.system()} {m['kernel']} {platform.machine()}; {m['cores']} CPUs; "
                         f"{m['cpu_model']}",
        "BENCH_COMMAND": head["command"],
    }
    return [f"export {k}={shlex.quote(str(v))}" for k, v in values.items()]

