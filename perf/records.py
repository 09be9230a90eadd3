"""The perf records under notes/: where they are, reading and writing them
in their own JSON style, and what a record's header must hold."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .header import HEADER_KEYS, ROOT

NOTES = ROOT / "notes"


def record_paths(notes: Path = NOTES) -> list[Path]:
    """Every perf record: notes/*.json and the JSON files of the notes' directories."""
    return sorted(notes.rglob("*.json"))


def load(path: Path) -> dict[str, Any]:
    rec = json.loads(path.read_text())
    if not isinstance(rec, dict):
        raise ValueError(f"{path}: a record is a JSON object")
    return rec


def style(text: str) -> tuple[int | None, bool, bool]:
    """(indent, ensure_ascii, trailing newline) of a JSON file's text, so
    that rewriting it changes only what changed."""
    m = re.match(r"[\[{]\n( +)", text)
    indent = len(m.group(1)) if m else None
    data = json.loads(text)
    ascii_ok = json.dumps(data, indent=indent, ensure_ascii=True) == text.rstrip("\n")
    return indent, ascii_ok, text.endswith("\n")


def save(path: Path, rec: dict[str, Any], like: str | None = None) -> None:
    """Writes ``rec`` to ``path`` in the style of ``like`` (the file's old text)."""
    indent, ascii_ok, newline = style(like) if like is not None else (1, True, True)
    path.write_text(json.dumps(rec, indent=indent, ensure_ascii=ascii_ok) + ("\n" if newline else ""))


def header_problems(rec: dict[str, Any]) -> Iterator[str]:
    """What is wrong with a record's header: a missing key, or a value of the
    wrong type (``null`` is allowed where the field was never recorded)."""
    for k in HEADER_KEYS:
        if k not in rec:
            yield f"no {k!r}"
    types: dict[str, tuple[type, ...]] = {
        "date": (str,), "commit": (str,), "dirty": (bool,), "machine": (dict,), "command": (str,),
        "versions": (dict,),
    }
    for k, t in types.items():
        v = rec.get(k)
        if v is not None and not isinstance(v, t):
            yield f"{k!r} is {type(v).__name__}, not {t[0].__name__} or null"
    commit = rec.get("commit")
    if isinstance(commit, str) and not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        yield f"'commit' is not a commit id: {commit!r}"
