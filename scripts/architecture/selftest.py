"""`check-architecture.py --self-test`: each rule fires on made-up files.

Every rule is shown twice: a clean tree passes, and the same tree with one
violation added is reported, so the check itself can fail (a check that can
never fail would pass silently after a refactor broke it).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from architecture import MAX_LINES, docs_rules, perf_rules, python_rules, rust_rules


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def rust(root: Path) -> None:
    write(root, "crates/c/src/lib.rs", "//! root\npub mod a;\npub mod b;\npub mod t;\npub mod u;\npub mod v;\n")
    write(root, "crates/c/src/u.rs", "//! u\npub struct U;\n")
    write(root, "crates/c/src/v.rs", "//! v\nuse crate::u::U;\n")
    write(root, "crates/c/src/a.rs", "//! a\nuse crate::b::X;\n")
    write(root, "crates/c/src/b.rs", "//! b\n// crate::a in a comment does not count\npub struct X;\n")
    # A circle inside one top-level module's tree is out of scope.
    write(root, "crates/c/src/t/mod.rs", "//! t\nmod x;\nmod y;\n")
    write(root, "crates/c/src/t/x.rs", "//! x\nuse crate::t::y::Y;\n")
    write(root, "crates/c/src/t/y.rs", "//! y\nuse crate::t::x::X;\n")
    write(root, "crates/c/tests/it.rs", "//! it\n" + "fn f() {}\n" * (MAX_LINES - 1))
    write(root, "fuzz/fuzz_targets/f.rs", "//! f\n")
    assert rust_rules.check(root) == [], rust_rules.check(root)

    write(root, "crates/c/src/b.rs", "//! b\nuse crate::a::Y;\n#[cfg(test)]\n" + "fn t() {}\n" * MAX_LINES)
    write(root, "crates/c/src/big.rs", "//! big\n" + "fn f() {}\n" * (MAX_LINES + 1))
    write(root, "crates/c/src/bare.rs", "fn f() {}\n")
    write(root, "crates/c/src/u.rs", "//! u\nuse super::v::V;\n")  # a top-level file's super:: is the root
    write(root, "crates/c/tests/it.rs", "//! it\n#[cfg(test)]\n" + "fn f() {}\n" * MAX_LINES)
    write(root, "crates/c/examples/ex.rs", "fn main() {}\n")
    write(root, "fuzz/fuzz_targets/f.rs", "//! f\n" + "fn f() {}\n" * MAX_LINES)
    got = "\n".join(rust_rules.check(root))
    assert "c: modules import each other in a circle: a -> b\n" in got, got
    assert "c: modules import each other in a circle: u -> v\n" in got, got
    assert "circle: x" not in got, got  # below the top level
    assert "big.rs: 602 non-test lines" in got, got
    assert "src/b.rs:" not in got, got  # unit tests do not count
    assert "bare.rs: does not open" in got, got
    assert "crates/c/tests/it.rs: 602 lines" in got, got  # integration tests count whole
    assert "crates/c/examples/ex.rs: does not open" in got, got
    assert "fuzz/fuzz_targets/f.rs: 601 lines" in got, got


def python(root: Path) -> None:
    pkg = "python/kvtier"
    write(root, f"{pkg}/__init__.py", '"""pkg"""\nfrom .keys import chain\n')
    # `_native` is an extension module (its stub stands in): a module, not the package.
    write(root, f"{pkg}/_native.pyi", "def f() -> None: ...\n")
    write(root, f"{pkg}/keys.py", '"""keys"""\nfrom . import _native\ndef chain(): ...\n')
    write(root, f"{pkg}/client.py", '"""client"""\nfrom . import keys\n')
    write(root, f"{pkg}/cluster.py", '"""cluster"""\nimport kvtier.client\nfrom kvtier import Error\n')
    # Annotation-only imports are exempt (python_rules' docstring says why).
    write(root, f"{pkg}/node.py", '"""node"""\nfrom typing import TYPE_CHECKING\n'
          'if TYPE_CHECKING:\n    from .vllm.worker import W\n')
    write(root, f"{pkg}/vllm/__init__.py", '"""vllm"""\n')
    write(root, f"{pkg}/vllm/worker.py", '"""worker"""\nfrom ..node import N\n')
    write(root, f"{pkg}/_gen/big.py", "x = 1\n" * (MAX_LINES + 1))  # generated: skipped
    write(root, "python/tests/test_a.py", "x = 1\n" * MAX_LINES)
    assert python_rules.check(root) == [], python_rules.check(root)

    # A lazy import (inside a function) closes a circle client -> cluster -> client.
    write(root, f"{pkg}/client.py", '"""client"""\ndef f():\n    from .cluster import ClusterClient\n')
    # Through a subpackage: node -> vllm.worker -> node.
    write(root, f"{pkg}/node.py", '"""node"""\nimport importlib\nw = importlib.import_module(".vllm.worker", __name__)\n')
    # The package's __init__ names a module that imports the package.
    write(root, f"{pkg}/__init__.py", '"""pkg"""\nfrom .keys import chain\n')
    write(root, f"{pkg}/keys.py", '"""keys"""\nfrom kvtier import chain as _c\n')
    write(root, f"{pkg}/bare.py", "x = 1\n")
    write(root, f"{pkg}/broken.py", '"""half-edited"""\ndef f(:\n')
    write(root, "python/tests/test_a.py", "x = 1\n" * (MAX_LINES + 1))
    write(root, "scripts/tool.py", '"""tool"""\n' + "x = 1\n" * MAX_LINES)
    got = "\n".join(python_rules.check(root))
    assert "circle: kvtier.client -> kvtier.cluster\n" in got, got
    assert "circle: kvtier.node -> kvtier.vllm.worker\n" in got, got
    assert "circle: kvtier -> kvtier.keys\n" in got, got
    assert "python/kvtier/bare.py: does not open with a docstring" in got, got
    assert "python/kvtier/broken.py: does not parse" in got, got
    assert "python/tests/test_a.py: 601 lines" in got, got
    assert "scripts/tool.py: 601 lines" in got, got
    assert "_gen" not in got, got


def docs(root: Path) -> None:
    for d in ("notes", "docs", "python"):
        (root / d).mkdir(exist_ok=True)
    write(root, "crates/c/src/a.rs", "")
    write(root, "crates/c/src/lib.rs", "")
    write(root, "python/kvtier/client.py", "")
    write(root, "Makefile", "all:\n")
    write(root, "README.md", "Code: `crates/c/src/a.rs`, run `make -C . test` (`Makefile`).\n"
          "See [the docs](docs/x.md#top), `c/src/lib.rs` and `crates/c/src/a.rs#L1`; a link is `[text](path.md)`.\n"
          "```sh\ncat > crates/c/new.rs   # a fenced block may create paths\necho `cat crates/c/new.rs`\n```\n")
    write(root, "docs/x.md", "[up](../README.md), `notes/NNN-title.md`, `crates/*/tests/`,\n"
          "`scripts/NAME.py`, [web](https://example.com/a/b), `python/kvtier/client.py:12`.\n")
    write(root, "out/report.md", "")  # build output, ignored
    write(root, ".gitignore", "/out\n")
    dirs = docs_rules.top_level(root)  # outside git: what is on disk, less .gitignore's
    assert dirs == {"crates", "docs", "notes", "python"}, dirs
    assert docs_rules.check(root, dirs) == [], docs_rules.check(root, dirs)

    write(root, "docs/x.md", "Gone: `crates/c/src/gone.rs`, [link](missing.md), `ANCHORS.md`,\n"
          "`c/src/nope.rs`, `serve --config=crates/c/x.toml out/y.txt`, [out](../../elsewhere.md).\n")
    write(root, "python/README.md", "[rel](kvtier/nope.py)\n")
    got = "\n".join(docs_rules.check(root, dirs))
    for bad in ("docs/x.md:1: names crates/c/src/gone.rs, which does not exist",
                "docs/x.md:1: links to missing.md, which does not exist",
                "docs/x.md:1: names ANCHORS.md",
                "docs/x.md:2: names crates/c/src/nope.rs",
                "docs/x.md:2: names crates/c/x.toml",
                "docs/x.md:2: links to ../../elsewhere.md, outside the repository",
                "python/README.md:1: links to kvtier/nope.py"):
        assert bad in got, (bad, got)
    assert "out/y.txt" not in got, got  # out/ is not a directory of this repository


def perf(root: Path) -> None:
    write(root, "scripts/_perf.py", "ROOT = 1\n")  # the shim itself is not a script
    write(root, "scripts/bench-a.py", '"""a"""\nfrom _perf import ROOT\n')
    write(root, "scripts/bench-b.sh", "#!/bin/sh\ncargo run\npython3 -m perf.stamp out/x.json\n")
    write(root, "scripts/bench-c.sh", '#!/bin/sh\nexec python3 "$(dirname "$0")/bench-a.py" "$@"\n')
    write(root, "scripts/inline.sh", "#!/bin/sh\npython3 - <<'EOF'\nfrom perf import write_record\nEOF\n")
    write(root, "scripts/tcp-floor.c", "int main(void) { return 0; }\n")  # not a script
    for pattern in perf_rules.ALLOWED:  # one script per entry, so none is unused
        write(root, "scripts/" + pattern.replace("*", "x") + ("" if pattern.endswith((".py", ".sh")) else ".sh"),
              "#!/bin/sh\n")
    assert perf_rules.check(root) == [], perf_rules.check(root)

    # Off the library: a hand-started server and stamp; "perf" in a word or a comment does not count.
    write(root, "scripts/bench-new.py", '"""new"""\nimport subprocess  # not perf.header\nsuperf.x = 1\n')
    # Runs a script that is itself off the library.
    write(root, "scripts/bench-new.sh", "#!/bin/sh\nexec python3 scripts/bench-new.py\n")
    (root / "scripts/link-dists.py").unlink()  # its ALLOWED entry is now unused
    got = "\n".join(perf_rules.check(root))
    assert "scripts/bench-new.py: measures without perf" in got, got
    assert "scripts/bench-new.sh: measures without perf" in got, got
    assert "ALLOWED entry 'link-dists.py' matches no script" in got, got
    assert "bench-a" not in got and "bench-b" not in got and "bench-c" not in got and "inline" not in got, got
    assert "tcp-floor" not in got and "scripts/_perf.py" not in got, got


def self_test() -> None:
    for rule in (rust, python, docs, perf):
        with tempfile.TemporaryDirectory() as d:
            rule(Path(d))
    print("check-architecture self-test: ok (rust, python, docs, perf)")
