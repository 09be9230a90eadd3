"""Builds the repository's Go tools (``tools/<name>``: psa-check, llmd-check)
into ``.tools/bin/<name>``, for the tests that use them as oracles.

A tool is rebuilt only when one of its sources (``*.go``, ``go.mod``,
``go.sum``) is newer than the binary: a cold build of llm-d's or Kubernetes'
module graph takes minutes on two cores. After a build the module and build
caches (``.tools/go``, about 2 GB for both tools) are deleted: the binary is
what later runs use, and CI's disk is needed by the vLLM install that follows
(README, "Prerequisites").
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .header import ROOT

BIN = ROOT / ".tools" / "bin"
GO_DIR = ROOT / ".tools" / "go"


class GoToolError(RuntimeError):
    """Go is missing or a tool did not build (a test fails on it, never skips)."""


def go() -> str:
    """The go command: PATH, else Go's default install directory."""
    found = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if os.access(p, os.X_OK)), None)
    if not found:
        raise GoToolError("Go is not installed (>= 1.26, https://go.dev/dl): the tools under tools/ need it")
    return found


def _stale(binary: Path, source: Path) -> bool:
    sources = [p for p in source.iterdir() if p.suffix in (".go", ".mod", ".sum")]
    if not sources:
        raise GoToolError(f"{source} holds no Go sources")
    return not binary.exists() or binary.stat().st_mtime < max(p.stat().st_mtime for p in sources)


def build(name: str) -> Path:
    """``.tools/bin/<name>``, built from ``tools/<name>`` when missing or stale."""
    source, binary = ROOT / "tools" / name, BIN / name
    if not _stale(binary, source):
        return binary
    # -modcacherw: a module cache Go leaves read-only could not be deleted below.
    env = os.environ | {"GOMODCACHE": str(GO_DIR / "mod"), "GOCACHE": str(GO_DIR / "cache"),
                        "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -modcacherw".strip()}
    r = subprocess.run([go(), "build", "-buildvcs=false", "-o", str(binary), "."], cwd=source, env=env,
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise GoToolError(f"go build tools/{name} failed:\n{r.stdout}{r.stderr}")
    binary.touch()  # go leaves an up-to-date binary unwritten: keep its mtime past the sources'
    shutil.rmtree(GO_DIR, ignore_errors=True)
    return binary
