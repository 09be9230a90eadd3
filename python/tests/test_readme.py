"""Every shell command and Python snippet in README.md and python/README.md
runs as written against a real server.

Code blocks are run in order, per file, with `kvtier` on PATH, in a scratch
directory that stands in for the repository root: it is inside the checkout
(so `cargo run -p ...` finds the workspace and its build) and links the
repository's `configs/`, `deploy/` and `python/`, while the files the
snippets write stay out of the checkout.
What is rewritten, and why:

* the default addresses 127.0.0.1:50051 / 127.0.0.1:8080 become the test
  server's ephemeral ones (and ``KVTIER_SERVER`` points the CLI at it);
* ``kvtier serve ...`` gets ``--print-config``: the flags and config are
  checked, but a server would run until stopped;
* ``make install`` becomes ``make -n install`` (the release build takes
  minutes; the suite builds the same crate).

A block right after ``<!-- readme-test: skip (reason) -->`` is not run; the
reason is mandatory.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

FENCE = re.compile(r"(?P<marker><!-- readme-test: skip \((?P<why>[^)]+)\) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)
DOCS = [REPO_ROOT / "README.md", REPO_ROOT / "python" / "README.md"]


def blocks(path: Path):
    for m in FENCE.finditer(path.read_text()):
        yield m.group("lang"), m.group("body"), m.group("why")


def test_every_block_is_run_or_says_why_not():
    for doc in DOCS:
        for lang, _body, why in blocks(doc):
            assert lang in ("sh", "python", "rust", "text", "toml", "json"), f"{doc.name}: unknown block language {lang}"
            if why is not None:
                assert len(why.strip()) > 10, f"{doc.name}: a skipped block needs a reason"


def _rewrite(text: str, server) -> str:
    return text.replace("127.0.0.1:50051", server.grpc).replace("127.0.0.1:8080", server.http)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_snippets_run_as_written(doc, kvtier_bin, tmp_path):
    from kvtier.server import Server

    work = REPO_ROOT / "out" / "readme-test" / doc.parent.name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for d in ("configs", "deploy", "python"):
        (work / d).symlink_to(REPO_ROOT / d)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "kvtier").symlink_to(kvtier_bin)
    ran = 0
    with Server.start(binary=kvtier_bin) as server:
        env = {
            **os.environ,
            "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
            "KVTIER_SERVER": f"http://{server.grpc}",
            "PYTHONPATH": str(REPO_ROOT / "python"),
        }
        for i, (lang, body, why) in enumerate(blocks(doc)):
            if why is not None or lang not in ("sh", "python"):
                continue
            code = _rewrite(body, server)
            if lang == "sh":
                code = re.sub(r"^(\s*kvtier serve\b[^\n]*?)(\s*#.*)?$", r"\1 --print-config >/dev/null\2", code, flags=re.M)
                code = re.sub(r"^make install\b", "make -n -C " + str(REPO_ROOT) + " install", code, flags=re.M)
                cmd = ["bash", "-euo", "pipefail", "-c", code]
            else:
                cmd = [sys.executable, "-c", code]
            r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, (
                f"{doc.name} block {i} ({lang}) failed with {r.returncode}:\n{body}\n--- stdout\n{r.stdout[-3000:]}"
                f"\n--- stderr\n{r.stderr[-3000:]}"
            )
            ran += 1
    assert ran >= 3, f"only {ran} blocks of {doc.name} ran"
