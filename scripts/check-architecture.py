#!/usr/bin/env python3
"""Checks the shape docs/architecture.md promises, on every crate's sources:

1. No import circles between a crate's top-level modules (`crate::a` used in
   module b and `crate::b` in module a, directly or through others). Paths in
   comments and in `#[cfg(test)]` code do not count.
2. No non-test source file over MAX_LINES lines (code before the first
   `#[cfg(test)]`).
3. Every source file opens with a `//!` comment saying why it exists.

Exit status 1 with one line per violation; `--self-test` checks that each rule
fires on a made-up crate (so the check itself can fail). Run by `make test`.
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

MAX_LINES = 600
ROOT = Path(__file__).resolve().parent.parent


def non_test(text: str) -> str:
    return text.split("#[cfg(test)]", 1)[0]


def strip_comments(text: str) -> str:
    return re.sub(r"//.*", "", text)


def top_module(src: Path, path: Path) -> str | None:
    rel = path.relative_to(src).with_suffix("").parts
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel in (("lib",), ("main",)) or not rel or rel[0] == "bin":
        return None
    return rel[0]


def module_graph(src: Path) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(src.rglob("*.rs")):
        mod = top_module(src, path)
        if mod is None:
            continue
        code = strip_comments(non_test(path.read_text()))
        deps = set(re.findall(r"\bcrate::([a-z_0-9]+)", code))
        if path.parent == src:  # a top-level file's `super::x` is the crate root's x
            deps |= set(re.findall(r"\bsuper::([a-z_0-9]+)", code))
        graph.setdefault(mod, set()).update(d for d in deps if d != mod)
    return {m: {d for d in ds if d in graph} for m, ds in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def check(crates: Path) -> list[str]:
    problems = []
    for crate in sorted(p for p in crates.iterdir() if (p / "src").is_dir()):
        src = crate / "src"
        for comp in cycles(module_graph(src)):
            problems.append(f"{crate.name}: modules import each other in a circle: {' -> '.join(comp)}")
        for path in sorted(src.rglob("*.rs")):
            text = path.read_text()
            n = non_test(text).count("\n")
            if n > MAX_LINES:
                problems.append(f"{path.relative_to(crates.parent)}: {n} non-test lines (limit {MAX_LINES})")
            if not text.lstrip().startswith("//!"):
                problems.append(f"{path.relative_to(crates.parent)}: does not open with a //! comment")
    return problems


def self_test() -> None:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "crates" / "c" / "src"
        src.mkdir(parents=True)
        (src / "lib.rs").write_text("//! root\npub mod a;\npub mod b;\n")
        (src / "a.rs").write_text("//! a\nuse crate::b::X;\n")
        (src / "b.rs").write_text("//! b\n// crate::a in a comment does not count\npub struct X;\n")
        assert check(src.parent.parent) == [], check(src.parent.parent)
        (src / "b.rs").write_text("//! b\nuse crate::a::Y;\n#[cfg(test)]\n" + "fn t() {}\n" * MAX_LINES)
        (src / "big.rs").write_text("//! big\n" + "fn f() {}\n" * (MAX_LINES + 1))
        (src / "bare.rs").write_text("fn f() {}\n")
        got = "\n".join(check(src.parent.parent))
        assert "circle: a -> b" in got, got
        assert "big.rs: 602 non-test lines" in got, got
        assert "b.rs:" not in got.replace("big.rs", ""), got  # test code does not count
        assert "bare.rs: does not open" in got, got
    print("check-architecture self-test: ok")


def main() -> int:
    if "--self-test" in sys.argv:
        self_test()
        return 0
    problems = check(ROOT / "crates")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"architecture: no module circles, no source file over {MAX_LINES} non-test lines, every file says why it exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
