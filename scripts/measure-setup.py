#!/usr/bin/env python3
"""What setting kvtier up costs a newcomer: the wall time of a set-up
command and the disk it leaves behind (notes/044-first-hour.md, README's
"Prerequisites").

For each checkout given (`--checkout DIR`, repeatable; default this one) it
measures, with `du -s -B1` (bytes of disk used, as `du -sh` shows them):
the whole checkout and `target/`, `.tools/` (and each tool under it),
`.venv/`, `out/demo/data/`; and once, the per-user caches the set-up fills
outside any checkout: `~/go` (MinIO's build) and `~/.cargo` (crates).
Hard links (`.tools/lmcache` links torch from `.tools/vllm`) are counted in
each directory that holds them, once in the checkout's total, so the parts
may add up to more than the whole.

`--time CMD` runs CMD in the first checkout (`bash -c`), records its wall
time and exit status, then measures: run it on a fresh clone
(`--time "make demo"`) to re-measure README's figures. Figures taken
elsewhere are recorded beside the measured ones with `--reported
LABEL=VALUE=SOURCE` (repeatable; VALUE a time, `597s`, or a size, `3.5G`):
they are kept apart, under `reported`, with where they came from, and
never mixed with what this script measured.

  python3 scripts/measure-setup.py --checkout /tmp/ci/main --checkout . \\
      --reported "make demo, fresh machine=597s=SOURCE" --out notes/044-first-hour.json
  python3 scripts/measure-setup.py --table notes/044-first-hour.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _perf import ROOT

from perf import header, versions, write_record

#: The directories of a checkout the set-up fills, relative to its root.
PARTS = ("target", ".tools", ".venv", "out/demo/data")
#: Per-user caches outside the checkout.
CACHES = ("~/go", "~/.cargo")


def du(path: Path) -> int | None:
    """Bytes of disk `path` uses (`du -s -B1`); None when it does not exist."""
    if not path.exists():
        return None
    r = subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True)
    # du exits 1 when a file vanished under it (a build in another checkout);
    # its total is still the total of what it found.
    try:
        return int(r.stdout.split()[0])
    except (IndexError, ValueError):
        raise SystemExit(f"du {path} failed: {r.stderr.strip()}") from None


def sizes(checkout: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"path": str(checkout), "total": du(checkout)}
    for part in PARTS:
        out[part] = du(checkout / part)
    tools = checkout / ".tools"
    if tools.is_dir():
        out["tools"] = {p.name: du(p) for p in sorted(tools.iterdir()) if p.is_dir()}
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"],
                            capture_output=True, text=True)
    out["commit"] = commit.stdout.strip() or None
    return out


def reported(spec: str) -> dict[str, Any]:
    """`LABEL=VALUE=SOURCE`, VALUE a time (`597s`) or a size as `du -sh`
    prints it (`3.5G`, GiB)."""
    label, value, source = spec.split("=", 2)
    out: dict[str, Any] = {"what": label, "value": value, "source": source}
    if value.endswith("s"):
        out["seconds"] = float(value[:-1])
    elif value.endswith("G"):
        out["bytes"] = round(float(value[:-1]) * 2**30)
    else:
        raise SystemExit(f"--reported {spec!r}: VALUE is seconds (597s) or GiB (3.5G)")
    return out


def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**30:.1f} GiB"


def table(rec: dict[str, Any]) -> str:
    lines = ["| checkout | total | " + " | ".join(f"`{p}/`" for p in PARTS) + " |",
             "|---|---|" + "---|" * len(PARTS)]
    for c in rec["checkouts"]:
        lines.append(f"| `{c['path']}` | {gib(c['total'])} | " + " | ".join(gib(c[p]) for p in PARTS) + " |")
    lines.append("")
    lines.append("| per-user cache | size |")
    lines.append("|---|---|")
    for k, v in rec["caches"].items():
        lines.append(f"| `{k}` | {gib(v)} |")
    for c in rec["checkouts"]:
        if c.get("tools"):
            lines.append("")
            lines.append(f"`.tools/` of `{c['path']}`: " + ", ".join(f"{k} {gib(v)}" for k, v in c["tools"].items()))
    if rec.get("timed"):
        t = rec["timed"]
        lines.append("")
        lines.append(f"Timed here: `{t['command']}` in `{t['cwd']}`: {t['seconds']:.0f} s (exit {t['exit']}).")
    if rec.get("reported"):
        lines.append("")
        lines.append("| reported by a previous run, not measured here | figure | source |")
        lines.append("|---|---|---|")
        for r in rec["reported"]:
            if "seconds" in r:
                m, s = divmod(round(r["seconds"]), 60)
                fig = f"{m}m{s:02d}s ({r['seconds']:.0f} s)"
            else:
                fig = gib(r["bytes"])
            lines.append(f"| {r['what']} | {fig} | {r['source']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", action="append", type=Path, help="a checkout to measure (default: this one)")
    ap.add_argument("--time", metavar="CMD", help="run CMD in the first checkout first, and time it")
    ap.add_argument("--reported", action="append", default=[], metavar="LABEL=VALUE=SOURCE",
                    help="a time (597s) or size (3.5G) measured elsewhere, recorded as such")
    ap.add_argument("--out", type=Path, help="the perf record to write")
    ap.add_argument("--table", type=Path, metavar="RECORD", help="print RECORD's tables and exit")
    a = ap.parse_args()
    if a.table:
        print(table(json.loads(a.table.read_text())))
        return 0
    go = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True) if shutil.which("go") else None
    head = header(versions=versions("cargo", "rustc", known={"go": go.stdout.strip() if go else None}))
    checkouts = [c.resolve() for c in (a.checkout or [ROOT])]
    rec: dict[str, Any] = {
        "title": "First hour: set-up time and disk",
        "method": "du -s -B1 (bytes of disk used) per directory, each directory on its own; "
                  "the checkout's total counts hard links once; times under 'reported' were "
                  "measured by someone else and are recorded with their source",
    }
    if a.time:
        t0 = time.monotonic()
        r = subprocess.run(["bash", "-c", a.time], cwd=checkouts[0])
        rec["timed"] = {"command": a.time, "cwd": str(checkouts[0]),
                        "seconds": round(time.monotonic() - t0, 1), "exit": r.returncode}
    rec["checkouts"] = [sizes(c) for c in checkouts]
    rec["caches"] = {c: du(Path(os.path.expanduser(c))) for c in CACHES}
    rec["reported"] = [reported(s) for s in a.reported]
    if a.out:
        write_record(a.out, rec, head)
    print(table(rec))
    return 0 if "timed" not in rec or rec["timed"]["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
