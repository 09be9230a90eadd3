"""One perf record for a note whose runs each wrote their own (several
scripts, or one script on several links):

    python3 -m perf.combine OUT.json PART.json [PART.json ...]

Each part is kept whole under ``parts``, keyed by its path relative to OUT's
directory. The header is the parts': the latest date, the commands joined
by `` && ``, the first part's machine and versions, the commits they ran at
(``commit`` is the latest part's) and ``dirty`` if any part was.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from .header import HEADER_KEYS, write_record


def combine(out: Path, parts: list[Path]) -> dict[str, Any]:
    recs = {os.path.relpath(p, out.parent): json.loads(p.read_text()) for p in parts}
    if not recs:
        raise SystemExit("no parts")
    latest = max(recs.values(), key=lambda r: r["date"])
    head = {k: latest.get(k) for k in HEADER_KEYS}
    head["command"] = " && ".join(r["command"] for r in recs.values())
    dirty = [r.get("dirty") for r in recs.values()]
    head["dirty"] = True if any(dirty) else (False if all(d is False for d in dirty) else None)
    commits = sorted({r["commit"] for r in recs.values() if r.get("commit")})
    return write_record(out, {"commits": commits, "parts": recs}, head)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("parts", type=Path, nargs="+")
    a = ap.parse_args(argv)
    combine(a.out, a.parts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
