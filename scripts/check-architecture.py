#!/usr/bin/env python3
"""Checks the shape docs/architecture.md promises ("Checked shape"), on the
Rust crates, the Python package and scripts, and the docs.

Rust (architecture/rust_rules.py):
1. No import circles between a crate's top-level modules (`crate::a` used in
   module b and `crate::b` in module a, directly or through others). Paths in
   comments and in `#[cfg(test)]` code do not count; circles inside one
   top-level module's tree are out of scope.
2. No file over MAX_LINES lines: in `src/`, the code before the first
   `#[cfg(test)]`; integration tests (crates/*/tests/), examples, benches,
   build scripts and fuzz/fuzz_targets/ count whole.
3. Every one of those files opens with a `//!` comment saying why it exists.

Python (architecture/python_rules.py):
4. No import circles between the modules of python/kvtier, subpackages
   included. Imports inside functions count (a lazy import still ties the two
   modules together); imports under `if TYPE_CHECKING:` are exempt, since they
   never run and only let annotations name a type.
5. No Python file over MAX_LINES lines (whole file) in python/, scripts/,
   perf/ and tests/ (generated python/kvtier/_gen/ is skipped).
6. Every python/kvtier module opens with a docstring.

Docs (architecture/docs_rules.py):
7. Every repository path that README.md, CONTRIBUTING.md, docs/**/*.md and
   the other README.md files (outside notes/) name exists: relative Markdown
   links, resolved from the doc; words in inline code that contain a `/` and
   start with a top-level directory that is not build output (crates/,
   python/, docs/, ...) or are top-level file names (Makefile,
   CONTRIBUTING.md), resolved from the root. Fenced code blocks are not read; placeholders (`*`, `<name>`, `...`,
   a word in capitals such as `notes/NNN-title.md`) are skipped.

Measurement scripts (architecture/perf_rules.py):
8. Every Python or shell script directly in scripts/ uses the perf library
   (imports it, runs `python3 -m perf.NAME`, or is a shell script that runs
   a script that does), or is on the rule's ALLOWED list of scripts that
   measure nothing, each with its reason; an ALLOWED entry no script needs
   is reported too.

Exit status 1 with one line per violation. `--rust`, `--python`, `--docs`,
`--perf` pick rule groups (default: all). `--self-test` checks that each rule fires on
made-up files (so the check itself can fail). Run by `make arch` (`make test`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from architecture import MAX_LINES, docs_rules, perf_rules, python_rules, rust_rules
from architecture.selftest import self_test

ROOT = Path(__file__).resolve().parent.parent

GROUPS = {
    "rust": (rust_rules.check, "no crate module circles, no Rust file over {n} lines, every file says why"),
    "python": (python_rules.check, "no kvtier import circles, no Python file over {n} lines, every module says why"),
    "docs": (docs_rules.check, "every repository path the docs name exists"),
    "perf": (perf_rules.check, "every measurement script in scripts/ runs on perf/"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description="Checks the shape docs/architecture.md promises; "
                                     "this script's docstring lists the rules.")
    parser.add_argument("--self-test", action="store_true", help="prove each rule fires on made-up files")
    for name in GROUPS:
        parser.add_argument(f"--{name}", action="store_true", help=f"check the {name} rules (default: all)")
    args = parser.parse_args()
    if args.self_test:
        self_test()
        return 0
    chosen = [name for name in GROUPS if getattr(args, name)] or list(GROUPS)
    failed = False
    for name in chosen:
        check, ok = GROUPS[name]
        problems = check(ROOT)
        for p in problems:
            print(p)
        if problems:
            failed = True
        else:
            print(f"architecture ({name}): {ok.format(n=MAX_LINES)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
