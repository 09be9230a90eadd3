"""The rules `scripts/check-architecture.py` checks, one module per kind of file.

* `graph`: circles in a dependency graph (shared by the Rust and Python rules);
* `rust_rules`: crates (module circles, file size, `//!` openings);
* `python_rules`: the SDK package and every Python file (import circles, file
  size, module docstrings);
* `docs_rules`: repository paths named in the docs exist;
* `perf_rules`: every measurement script in `scripts/` uses perf/;
* `selftest`: proves each rule fires on made-up files.

`scripts/check-architecture.py`'s docstring states the rules and the choices
behind them (docs/architecture.md, "Checked shape"). Each module returns its
problems as lines of text; none imports another's rules, so they can run alone.
"""

#: Longest a source file may be, in lines (docs/architecture.md, "Checked shape").
MAX_LINES = 600
