"""One-off: gives every record already in notes/ the header new records carry
(perf/header.py), mapping the names older scripts used and writing ``null``
for what was never recorded. Every existing field and number is kept; the
header keys move to the front. Kept, not deleted, because the decisions
below (which records were from a clean tree) are part of the record's
meaning; running it again changes nothing.

    python3 -m perf.migrate [--check]

Mapping:

* ``commit``: ``commit``, else ``git_commit``, without a ``-dirty`` suffix
  (``git_commit`` itself is kept as it was);
* ``dirty``: ``dirty``; ``git_dirty``; ``true`` when the commit carried
  ``-dirty``; ``false`` where the script that wrote the record appended
  ``-dirty`` to a dirty tree's commit (checked in the script as of the
  record's commit: CLEAN_UNLESS_SUFFIXED) and this one has none; ``true``
  where the note says the tree differed (DIRTY_PER_NOTE); else ``null``;
* ``machine``: the old object, with ``cpu_model`` (from ``cpu``), ``cores``
  (``cpus``, ``nproc``), ``memory_gib`` (``memory_bytes`` / 2^30),
  ``kernel`` and ``congestion_control`` (``tcp_congestion_control_system``,
  or the bench's ``network.system_default_cc``) added; a machine recorded
  as one string is kept as ``description``, with what it states parsed;
* ``command``: ``command``, else the bench's ``command_line`` (a list,
  joined as a shell would read it);
* ``versions``: ``versions``, else the versions the record states elsewhere
  (a peer's name such as ``redis 7.0.15``, ``machine.python``, ``store``),
  else ``null``.
"""
from __future__ import annotations

import argparse
import fnmatch
import re
import shlex
import sys
from typing import Any

from .header import HEADER_KEYS, MACHINE_KEYS, ROOT
from .records import header_problems, load, record_paths, save

#: Records whose script appended "-dirty" to the commit of a dirty tree (the
#: script at the record's commit does so), so a commit without it was clean:
#: flood-memory.py (014), netlab.py (015), netlab-cold.py (023),
#: cost-split.py (027, 032), overload-knee.py (028-031).
CLEAN_UNLESS_SUFFIXED = [
    "notes/014-grpc-flood-memory.json",
    "notes/015-netlab.json", "notes/015-netlab/*/record.json",
    "notes/023-cold-path.json", "notes/023-cold-path/record.json",
    "notes/027-cost-split.json", "notes/032-crc-ablation.json",
    "notes/028-*.json", "notes/029-*.json", "notes/030-*.json", "notes/031-*.json",
]

#: Records whose note says the tree differed from the recorded commit.
DIRTY_PER_NOTE = {
    # notes/020: "The binary was built from f696243 plus the changes committed next".
    "notes/020-rtt-prefix.json": True, "notes/020-rtt-prefix/*": True,
    # notes/021: "taken at 8996efaf64 with the script's port fix not yet committed".
    "notes/021-cluster.json": True, "notes/021-cluster/*": True,
}


def _matches(rel: str, patterns: Any) -> bool:
    return any(fnmatch.fnmatch(rel, p) for p in patterns)


def _commit_dirty(rec: dict[str, Any], rel: str) -> tuple[str | None, bool | None]:
    raw = rec.get("commit", rec.get("git_commit"))
    commit = raw if isinstance(raw, str) and raw not in ("", "unknown") else None
    suffixed = bool(commit and commit.endswith("-dirty"))
    if commit and suffixed:
        commit = commit[: -len("-dirty")]
    if isinstance(rec.get("dirty"), bool):
        dirty: bool | None = rec["dirty"]
    elif isinstance(rec.get("git_dirty"), bool):
        dirty = rec["git_dirty"]
    elif suffixed:
        dirty = True
    elif _matches(rel, DIRTY_PER_NOTE):
        dirty = True
    elif _matches(rel, CLEAN_UNLESS_SUFFIXED):
        dirty = False
    else:
        dirty = None
    return commit, dirty


def _parse_machine_text(text: str) -> dict[str, Any]:
    """"Linux 6.18.44-fc-v669 x86_64; 2 CPUs; AMD EPYC" and the like."""
    kernel = re.search(r"(\d+\.\d+\.\d+(?:-[\w.]+)*?)(?=[- ](?:x86_64|aarch64)|;|$)", text)
    cores = re.search(r"(\d+) CPUs?", text)
    parts = [p.strip() for p in text.split(";")]
    model = next((p for p in parts[1:] if not re.search(r"CPUs?$|GPU", p)), None)
    return {"cpu_model": model, "cores": int(cores.group(1)) if cores else None,
            "kernel": kernel.group(1) if kernel else None}


def _system_cc(rec: dict[str, Any]) -> str | None:
    net = rec.get("network")
    if not isinstance(net, dict):
        return None
    if isinstance(net.get("system_default_cc"), str):
        return str(net["system_default_cc"])
    seen = {v.get("system_default_cc") for v in net.values() if isinstance(v, dict)}
    seen.discard(None)
    return str(seen.pop()) if len(seen) == 1 else None


def _machine(rec: dict[str, Any]) -> dict[str, Any] | None:
    old = rec.get("machine")
    if old is None:
        return None
    if isinstance(old, str):
        found: dict[str, Any] = _parse_machine_text(old)
        rest: dict[str, Any] = {"description": old}
    else:
        rest = dict(old)
        mem = old.get("memory_gib")
        if mem is None and isinstance(old.get("memory_bytes"), int):
            mem = round(old["memory_bytes"] / 2**30, 1)
        found = {
            "cpu_model": old.get("cpu_model", old.get("cpu")),
            "cores": old.get("cores", old.get("cpus", old.get("nproc"))),
            "memory_gib": mem,
            "kernel": old.get("kernel"),
            "congestion_control": old.get("congestion_control", old.get("tcp_congestion_control_system")),
        }
    if found.get("congestion_control") is None:
        found["congestion_control"] = _system_cc(rec)
    out = {k: rest.get(k, found.get(k)) for k in MACHINE_KEYS}
    out.update({k: v for k, v in rest.items() if k not in out})
    return out


def _command(rec: dict[str, Any]) -> str | None:
    cmd = rec.get("command", rec.get("command_line"))
    if isinstance(cmd, list):
        return shlex.join(str(c) for c in cmd)
    return cmd if isinstance(cmd, str) else None


def _name_version(text: str) -> tuple[str, str] | None:
    m = re.fullmatch(r"\s*(.+?) v?(\d[\w.+-]*)\s*", text)
    return (m.group(1), m.group(2)) if m else None


def _versions(rec: dict[str, Any]) -> dict[str, Any] | None:
    if isinstance(rec.get("versions"), dict):
        return dict(rec["versions"])
    found: dict[str, Any] = {}
    names: list[str] = []
    peer = rec.get("peer")
    if isinstance(peer, dict) and isinstance(peer.get("name"), str):
        names.append(peer["name"])
    peers = rec.get("peers")
    groups = peers.values() if isinstance(peers, dict) else [peers] if isinstance(peers, list) else []
    for group in groups:
        for p in group if isinstance(group, list) else []:
            if isinstance(p, dict) and isinstance(p.get("name"), str):
                names.append(p["name"])
    for n in names:
        nv = _name_version(n)
        if nv:
            found[nv[0]] = nv[1]
    machine = rec.get("machine")
    if isinstance(machine, dict):
        for k in ("python", "torch", "cuda"):
            if isinstance(machine.get(k), str):
                found[k] = machine[k]
    store = rec.get("store")
    if isinstance(store, str):  # "Azurite 3.35 (loopback) via object_store 0.12"
        for m in re.finditer(r"([A-Za-z_][\w-]*) (\d+(?:\.\d+)+)", store):
            found[m.group(1).lower()] = m.group(2)
    base = rec.get("base_binary")
    if isinstance(base, dict) and isinstance(base.get("version"), str):
        nv = _name_version(base["version"])
        if nv:
            found[f"{nv[0]} (base binary)"] = nv[1]
    return found or None


def migrate(rec: dict[str, Any], rel: str) -> dict[str, Any]:
    """``rec`` with the header in front (every old field kept)."""
    commit, dirty = _commit_dirty(rec, rel)
    head = {
        "date": rec.get("date"),
        "commit": commit,
        "dirty": dirty,
        "machine": _machine(rec),
        "command": _command(rec),
        "versions": _versions(rec),
    }
    return {**head, **{k: v for k, v in rec.items() if k not in HEADER_KEYS}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a record would change")
    a = ap.parse_args(argv)
    changed = 0
    for path in record_paths():
        rel = str(path.relative_to(ROOT))
        text = path.read_text()
        old = load(path)
        if all(k in old for k in HEADER_KEYS) and not list(header_problems(old)):
            continue  # already carries the header: left as it is
        new = migrate(old, rel)
        problems = list(header_problems(new))
        if problems:
            print(f"{rel}: {'; '.join(problems)}", file=sys.stderr)
            return 2
        changed += 1
        print(f"{'would convert' if a.check else 'converted'} {rel}: commit {str(new['commit'])[:10]}, "
              f"dirty {new['dirty']}, versions {new['versions']}")
        if not a.check:
            save(path, new, like=text)
    print(f"{changed} record(s) {'to convert' if a.check else 'converted'}")
    return 1 if a.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
