"""Gives a record another tool wrote (``kvtier bench``'s ``record.json``, the
object-store example's record) perf's header, right after that tool ran:

    python3 -m perf.stamp RECORD [--command CMD] [--versions redis-server,azurite] [--kvtier BIN]
    eval "$(python3 -m perf.stamp --env --command CMD)"   # before a program that stamps its own record

What the record already says is kept and mapped to the header's names as
perf/migrate.py maps old records (``git_commit`` with ``-dirty``,
``command_line``, a machine as one string); what it does not say is taken
from this machine and checkout now (the run has just ended here): the
commit and whether the tree is dirty, the machine's missing fields, the
versions of the tools named, and ``CMD`` as the command when the record
has none. Every field of the record is kept.

``--env`` prints, instead, the header measured now as ``export BENCH_DATE=...
BENCH_COMMIT BENCH_MACHINE BENCH_COMMAND`` lines, for a program that writes
those into its own record (``crates/kvtier-server/examples/object_bench.rs``,
run by scripts/bench-object-store.sh), so no script computes them by hand.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .header import HEADER_KEYS, env_exports, header, versions
from .migrate import migrate
from .records import load, save


def stamp_now(rec: dict[str, Any], command: str | None = None, tools: list[str] | None = None,
              kvtier: str | None = None) -> dict[str, Any]:
    """``rec`` with the header: its own values mapped, the missing ones measured now."""
    out = migrate(rec, rel="")
    names = list(tools or []) + (["kvtier"] if kvtier else [])
    live = header(command=command, versions=versions(*names, paths={"kvtier": kvtier} if kvtier else None))
    if out["commit"] is None or out["commit"] == live["commit"]:
        out["commit"] = live["commit"]
        if out["dirty"] is None:
            out["dirty"] = live["dirty"]
    if out["machine"] is None:
        out["machine"] = live["machine"]
    else:
        out["machine"] = {**live["machine"], **{k: v for k, v in out["machine"].items() if v is not None}}
    for k in ("date", "command"):
        if out[k] is None:
            out[k] = live[k]
    out["versions"] = {**live["versions"], **(out["versions"] or {})}
    return {**{k: out[k] for k in HEADER_KEYS}, **out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("record", type=Path, nargs="?")
    ap.add_argument("--env", action="store_true",
                    help="print the header as `export BENCH_*=...` lines for a shell's eval; stamp nothing")
    ap.add_argument("--command", help="what produced the record, if the record does not say")
    ap.add_argument("--versions", default="", help="tools whose versions to record (comma-separated)")
    ap.add_argument("--kvtier", help="the kvtier binary that ran (its version is recorded)")
    a = ap.parse_args(argv)
    if a.env:
        print("\n".join(env_exports(header(command=a.command))))
        return 0
    if a.record is None:
        ap.error("a RECORD to stamp (or --env)")
    text = a.record.read_text()
    rec = stamp_now(load(a.record), a.command, [t for t in a.versions.split(",") if t], a.kvtier)
    save(a.record, rec, like=text)
    print(f"stamped {a.record}: commit {str(rec['commit'])[:10]}, dirty {rec['dirty']}, versions {rec['versions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
