"""The measurement rule: every script in `scripts/` runs on the perf library.

A number in the docs comes from a record a script wrote (perf/README.md), so
a script that measures must take its header, its services and its stamp from
`perf/`, not from code of its own. A Python or shell file directly in
`scripts/` passes when it

* uses perf itself: `from _perf import`, `import _perf`, `from perf... import`,
  `import perf`, or `python3 -m perf.NAME` (shell, and Python inside a shell
  heredoc); or
* is a shell script that runs one that does (`scripts/NAME.py`,
  `"$(dirname "$0")/NAME.py"`): the notes' re-run commands name some shell
  files that only exec a Python driver; or
* is on ALLOWED, a short list of scripts that measure nothing, each with its
  reason.

An ALLOWED entry that matches no script, or only scripts that now use perf, is
reported too, so the list stays short and true.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

#: Scripts that measure nothing (glob over the file name -> why).
ALLOWED = {
    "setup*.sh": "installs tools; measures nothing",
    "build-native.sh": "builds the SDK's native core",
    "fuzz.sh": "runs the fuzz targets; its findings are crashes, not records",
    "check-*": "checks (architecture, report rendering); they pass or fail, they write no record",
    "demo*": "`make demo`: a walk-through whose bench output is not quoted by any note",
    "gen-placement-vectors.py": "writes test vectors, not a measurement",
    "link-dists.py": "links installed Python distributions between venvs",
}

#: Uses perf directly (Python, or a shell command / heredoc).
USES_PERF = re.compile(r"^\s*(from _perf import|import _perf\b|from perf(\.\w+)* import|import perf\b)"
                       r"|\bpython3? -m perf\.\w+", re.M)
#: A script in scripts/ that a shell script runs.
RUNS = re.compile(r"(?:scripts/|\$\(dirname \"?\$0\"?\)/)([\w.-]+\.py)")


def scripts(root: Path) -> list[Path]:
    d = root / "scripts"
    return sorted(p for p in d.iterdir() if p.is_file() and p.suffix in (".py", ".sh") and p.name != "_perf.py")


def allowed(name: str) -> str | None:
    return next((pattern for pattern in ALLOWED if fnmatch.fnmatch(name, pattern)), None)


def check(root: Path) -> list[str]:
    files = scripts(root)
    on_perf = {p.name for p in files if USES_PERF.search(p.read_text(errors="replace"))}
    problems, used = [], set()
    for p in files:
        if p.name in on_perf:
            continue
        if p.suffix == ".sh" and any(name in on_perf for name in RUNS.findall(p.read_text(errors="replace"))):
            continue
        pattern = allowed(p.name)
        if pattern is not None:
            used.add(pattern)
            continue
        problems.append(f"scripts/{p.name}: measures without perf: import it (`from _perf import ROOT`, "
                        "perf/README.md) or, if it measures nothing, add it to ALLOWED in "
                        "scripts/architecture/perf_rules.py with the reason")
    for pattern in sorted(set(ALLOWED) - used):
        problems.append(f"scripts/architecture/perf_rules.py: ALLOWED entry {pattern!r} matches no script off "
                        "perf; remove it")
    return problems
