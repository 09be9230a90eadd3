"""The docs rule: every repository path the docs name exists.

Docs: README.md, CONTRIBUTING.md (if present), docs/**/*.md, and every other
README.md in the tree outside notes/ (python/README.md, fuzz/README.md, ...).
notes/ is a dated log of what was true then, so it is not checked.

What counts as naming a path:
* **Markdown links** `[text](target)` and `[ref]: target` whose target is
  relative (no scheme, not `#anchor`, not `/absolute`): resolved from the
  doc's own directory, as GitHub resolves them; `#anchor` is dropped.
* **Inline code** (`` `...` ``, outside fenced code blocks), split into words
  at spaces and `=` so a path inside a command counts
  (`kvtier serve --config configs/kvtier.toml`): a word is a repository path,
  resolved from the repository root, when it contains a `/` and starts with a
  top-level directory of the repository (one with files git tracks or would
  track: crates/, python/, scripts/, docs/, notes/, ...; not build output
  such as target/ or out/), or when it is a bare top-level file name:
  one of ROOT_FILES or a capitalised Markdown name (`CONTRIBUTING.md`). A
  word that starts with a crate's directory and one of CRATE_PARTS
  (`kvtier-bench/src/x.rs`) is read as under crates/.
  Surrounding quotes, brackets and trailing punctuation, a leading `./`, a
  `:LINE` suffix and a `#anchor` are dropped.
* Fenced code blocks do not count: they are commands and output (README's
  are run by python/tests/test_readme.py), and may create the paths they name.

Placeholders are skipped, never guessed: a path with `*`, `?`, `<`, `>`,
`{`, `}`, `[`, `]`, `$`, `|`, `...` or `…` in it (`notes/NNN-...`,
`crates/*/tests/`), or with a word in capitals (between `/`, `.` and `-`)
that is not a conventional document name (`scripts/NAME.py`,
`notes/NNN-title.md`, `crates/CRATE/`; but `fuzz/README.md` is checked).

"Exists" means on disk in this checkout, a directory or a file. A path git
ignores is build output (`python/kvtier/_native.abi3.so`, made by `make
native`): it need not exist in a fresh clone, so it is not checked.
"""
from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

#: Top-level files a doc may name without a `/`.
ROOT_FILES = ("Makefile", "Cargo.toml", "Cargo.lock", "mypy.ini", "ruff.toml")
#: Capitalised names that are real files, not placeholders.
DOC_NAMES = {"README", "CHANGELOG", "CONTRIBUTING", "LICENSE", "SECURITY", "NOTICE", "AUTHORS", "CODEOWNERS"}
#: What a crate directory holds: `kvtier-bench/src/x.rs` names crates/kvtier-bench/src/x.rs.
CRATE_PARTS = {"src", "tests", "examples", "benches", "build.rs", "Cargo.toml"}
#: Directories never searched for README.md.
SKIP_DIRS = {"notes", "target", "node_modules", "_gen", "out"}

FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
PLACEHOLDER_CHARS = set("*?<>{}[]$|…")
CAPS_WORD = re.compile(r"[A-Z][A-Z0-9_]*")


def top_level(root: Path) -> set[str]:
    """The directories at the top of the repository: those holding files git
    tracks or would track (so build output such as target/ and out/ holds no
    repository path), or
    outside a git checkout those on disk, less hidden ones and those the
    root .gitignore names (`/target`, `out/`)."""
    try:
        git = ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        out = subprocess.run(git, capture_output=True, check=True).stdout
        dirs = {p.split("/", 1)[0] for p in out.decode().split("\0") if "/" in p}
    except (OSError, subprocess.CalledProcessError):
        dirs = set()
    if dirs:
        return dirs
    ignore = root / ".gitignore"
    ignored = {line.strip().strip("/") for line in ignore.read_text().splitlines()} if ignore.is_file() else set()
    return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in ignored}


def doc_files(root: Path, dirs: set[str]) -> Iterator[Path]:
    for name in ("README.md", "CONTRIBUTING.md"):
        if (root / name).is_file():
            yield root / name
    if (root / "docs").is_dir():
        yield from sorted((root / "docs").rglob("*.md"))
    for top in sorted(dirs - SKIP_DIRS - {"docs"}):
        for path in sorted((root / top).rglob("README.md")):
            parts = path.relative_to(root).parts[:-1]
            if not any(p in SKIP_DIRS or p.startswith(".") for p in parts):
                yield path


def is_placeholder(path: str) -> bool:
    if PLACEHOLDER_CHARS.intersection(path) or "..." in path.replace("../", ""):
        return True
    pieces = re.split(r"[/.\-]", path)
    return any(CAPS_WORD.fullmatch(p) and p not in DOC_NAMES for p in pieces)


def clean(word: str) -> str:
    word = word.strip("\"'()[],;").rstrip(".:")
    word = word.removeprefix("./")
    word = re.sub(r":\d+(-\d+)?$", "", word)
    return word.split("#", 1)[0]


def code_paths(span: str, dirs: set[str], crates: set[str]) -> Iterator[str]:
    """The words of an inline code span that name repository paths."""
    for raw in re.split(r"[\s=]+", span):
        word = clean(raw)
        if "/" in word:
            first = word.split("/", 1)[0]
            if is_placeholder(word):
                continue
            if first in dirs:
                yield word
            elif first in crates and word.split("/")[1] in CRATE_PARTS:  # short for crates/<word>
                yield f"crates/{word}"
        elif word in ROOT_FILES or re.fullmatch(r"[A-Z][A-Za-z0-9_-]*\.md", word):
            yield word


def named_paths(text: str, dirs: set[str], crates: set[str]) -> Iterator[tuple[int, str, bool]]:
    """(line, path, whether it is relative to the doc rather than the root)."""
    fenced = False
    for lineno, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in CODE_SPAN.finditer(line):
            for path in code_paths(m.group(2), dirs, crates):
                yield lineno, path, False
        unspanned = CODE_SPAN.sub("", line)
        for target in LINK.findall(unspanned) + REF_DEF.findall(unspanned):
            if SCHEME.match(target) or target.startswith(("#", "/")):
                continue
            target = unquote(target.split("#", 1)[0].split("?", 1)[0])
            if target and not is_placeholder(target):
                yield lineno, target, True


def check(root: Path, dirs: set[str] | None = None) -> list[str]:
    if dirs is None:
        dirs = top_level(root)
    crates = {p.name for p in (root / "crates").glob("*") if p.is_dir()}
    problems = []
    resolved_root = root.resolve()
    for doc in doc_files(root, dirs):
        rel_doc = doc.relative_to(root)
        for lineno, path, from_doc in named_paths(doc.read_text(), dirs, crates):
            target = ((doc.parent if from_doc else root) / path).resolve()
            kind = "links to" if from_doc else "names"
            if resolved_root not in (target, *target.parents):
                problems.append(f"{rel_doc}:{lineno}: {kind} {path}, outside the repository")
            elif not target.exists() and not ignored(root, target):
                problems.append(f"{rel_doc}:{lineno}: {kind} {path}, which does not exist")
    return problems


def ignored(root: Path, target: Path) -> bool:
    """Whether git ignores `target` (build output); False outside a checkout."""
    try:
        r = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", str(target)], capture_output=True)
    except OSError:
        return False
    return r.returncode == 0
