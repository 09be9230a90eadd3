"""The Rust rules: module circles, file size and `//!` openings.

* No import circles between a crate's **top-level** modules (`crate::a` used
  in module b and `crate::b` in module a, directly or through others). Paths in
  comments and in `#[cfg(test)]` code do not count. Circles inside one
  top-level module's own tree (`a::x` and `a::y`) are out of scope: the tree
  is one unit to the rest of the crate.
* No file over MAX_LINES lines: a crate's `src/` counts the code before its
  first `#[cfg(test)]`; integration tests (`crates/*/tests/`), examples,
  benches, build scripts and `fuzz/fuzz_targets/` count the whole file, since
  they have no test module to set apart.
* Every one of those files opens with a `//!` comment saying why it exists.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from architecture import MAX_LINES
from architecture.graph import cycles

#: Directories of a crate whose files are counted whole.
WHOLE_FILE_DIRS = ("tests", "examples", "benches")


def non_test(text: str) -> str:
    return text.split("#[cfg(test)]", 1)[0]


def strip_comments(text: str) -> str:
    return re.sub(r"//.*", "", text)


def top_module(src: Path, path: Path) -> str | None:
    rel = path.relative_to(src).with_suffix("").parts
    if rel and rel[-1] == "mod":
        rel = rel[:-1]
    if not rel or rel in (("lib",), ("main",)) or rel[0] == "bin":
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


def whole_files(root: Path) -> Iterator[Path]:
    """The Rust files outside a crate's `src/`, counted whole."""
    for crate in sorted(p for p in (root / "crates").glob("*") if p.is_dir()):
        for d in WHOLE_FILE_DIRS:
            yield from sorted((crate / d).rglob("*.rs"))
        if (crate / "build.rs").is_file():
            yield crate / "build.rs"
    yield from sorted((root / "fuzz" / "fuzz_targets").rglob("*.rs"))


def check(root: Path) -> list[str]:
    problems = []
    crates = root / "crates"
    sized: list[tuple[Path, str, str]] = []  # (file, the code counted, what it is)
    for crate in sorted(p for p in crates.glob("*") if (p / "src").is_dir()):
        src = crate / "src"
        for comp in cycles(module_graph(src)):
            problems.append(f"{crate.name}: modules import each other in a circle: {' -> '.join(comp)}")
        for path in sorted(src.rglob("*.rs")):
            text = path.read_text()
            sized.append((path, non_test(text), "non-test lines"))
            if not text.lstrip().startswith("//!"):
                problems.append(f"{path.relative_to(root)}: does not open with a //! comment")
    for path in whole_files(root):
        text = path.read_text()
        sized.append((path, text, "lines"))
        if not text.lstrip().startswith("//!"):
            problems.append(f"{path.relative_to(root)}: does not open with a //! comment")
    for path, counted, what in sized:
        n = counted.count("\n")
        if n > MAX_LINES:
            problems.append(f"{path.relative_to(root)}: {n} {what} (limit {MAX_LINES})")
    return problems
