"""Compiles ``proto/`` into the ``kvtier._gen`` stub package (standard library only).

Two callers share it: the package build (``python/setup.py`` loads this file
by path, because the build environment has grpcio-tools but none of kvtier's
runtime dependencies, so ``kvtier`` itself cannot be imported there) and
:mod:`kvtier._proto`, which regenerates stubs in a development checkout.
``grpc_tools`` is imported only when something is generated.

The generated tree, laid out like ``proto/``::

    _gen/kvtier/v1/kvtier_pb2.py, kvtier_pb2_grpc.py, kvtier_pb2.pyi, wire_pb2.py (data plane)
    _gen/kvstore/kvstore_pb2.py, kvstore_pb2_grpc.py, kvstore_pb2.pyi
    _gen/STAMP.json

``STAMP.json`` records content hashes of the proto files (not mtimes: a fresh
git checkout gives every file a new mtime) and the grpcio-tools version that
generated the stubs. The generated modules' absolute imports of each other
(``from kvtier.v1 import kvtier_pb2``, which would resolve against *this*
package) are rewritten into relative ones.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

#: The proto files compiled, relative to the proto root.
PROTO_FILES = ("kvtier/v1/kvtier.proto", "kvtier/v1/wire.proto", "kvstore/kvstore.proto")
TOP_LEVEL = {p.split("/", 1)[0] for p in PROTO_FILES}
STAMP = "STAMP.json"
STAMP_FORMAT = 2

#: What a stamp holds: ``format``, ``grpcio_tools`` (a version or ``None``), ``protos`` (path -> sha256).
Stamp = dict[str, Any]


class GenerateError(Exception):
    """The stubs cannot be generated (no grpcio-tools, or protoc failed)."""


def find_proto_dir(candidates: Iterable[Path]) -> Path | None:
    """The first candidate that holds every file of :data:`PROTO_FILES`."""
    for c in candidates:
        if all((c / f).is_file() for f in PROTO_FILES):
            return c
    return None


def tools_available() -> bool:
    """Whether ``grpc_tools`` can be imported (without importing it)."""
    try:
        return find_spec("grpc_tools") is not None
    except (ImportError, ValueError):
        return False


def tools_version() -> str | None:
    """The installed grpcio-tools version, or ``None``."""
    if not tools_available():
        return None
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return version("grpcio-tools")
    except PackageNotFoundError:
        return None


def wanted_stamp(root: Path) -> Stamp:
    """The stamp that stubs generated now from ``root`` would carry."""
    return {
        "format": STAMP_FORMAT,
        "grpcio_tools": tools_version(),
        "protos": {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in PROTO_FILES},
    }


def read_stamp(gen: Path) -> Stamp | None:
    try:
        stamp = json.loads((gen / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def is_fresh(gen: Path, wanted: Stamp | None, any_tools: bool = False) -> bool:
    """Whether the stubs in ``gen`` can be used as they are.

    ``wanted=None`` (no proto files to compare with) takes any complete tree.
    Stubs from another grpcio-tools version count as stale only when a
    grpcio-tools is installed to regenerate them and ``any_tools`` is false.
    """
    have = read_stamp(gen)
    if have is None or have.get("format") != STAMP_FORMAT:
        return False
    if wanted is None:
        return True
    if have.get("protos") != wanted["protos"]:
        return False
    return any_tools or wanted["grpcio_tools"] is None or have.get("grpcio_tools") == wanted["grpcio_tools"]


_BUILD_RE = re.compile(r"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'[\w.]+'(, _globals\))")
_IMPORT_RE = re.compile(r"^(?P<indent>[ \t]*)from (?P<mod>[A-Za-z_][\w.]*) import ", re.MULTILINE)


def relativize(path: Path, root: Path) -> None:
    """Rewrites ``from kvtier.v1 import x`` in a generated module into ``from . import x``."""
    pkg = list(path.relative_to(root).parent.parts)
    text = path.read_text()

    def repl(m: re.Match[str]) -> str:
        target = m.group("mod").split(".")
        if target[0] not in TOP_LEVEL:
            return m.group(0)  # google.protobuf, grpc, ...
        common = 0
        while common < min(len(pkg), len(target)) and pkg[common] == target[common]:
            common += 1
        rel = "." * (len(pkg) - common + 1) + ".".join(target[common:])
        return f"{m.group('indent')}from {rel} import "

    new = _IMPORT_RE.sub(repl, text)
    # Message classes' __module__ (used by pickle and reprs) should name the
    # module they really live in, not the proto package path.
    new = _BUILD_RE.sub(r"\1__name__\2", new)
    if new != text:
        path.write_text(new)


def generate_into(out: Path, root: Path, wanted: Stamp) -> None:
    """Runs ``grpc_tools.protoc`` on ``root``'s protos into the (existing) directory ``out``."""
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise GenerateError("grpcio-tools is not installed (pip install grpcio-tools)") from e
    from importlib import resources

    include = str(resources.files("grpc_tools") / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *PROTO_FILES,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise GenerateError(f"grpc_tools.protoc failed with exit code {rc}: {' '.join(args)}")
    for d in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        (d / "__init__.py").touch()
    for f in list(out.rglob("*.py")) + list(out.rglob("*.pyi")):
        relativize(f, out)
    (out / STAMP).write_text(json.dumps(wanted, indent=1, sort_keys=True) + "\n")


class FileLock:
    """An exclusive inter-process lock (fcntl where available; no-op elsewhere)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def __enter__(self) -> FileLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return self
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def ensure_at(parent: Path, root: Path, wanted: Stamp, any_tools: bool = False) -> Path:
    """Makes ``parent/_gen`` fresh (see :func:`is_fresh`) and returns it.

    Generation runs into a temporary directory beside ``_gen``, writes the
    stamp and then renames the directory into place, all under an
    inter-process file lock, so concurrent callers (pytest-xdist, several
    workers, a build beside a test run) neither see a half-written tree nor race.
    """
    gen = parent / "_gen"
    if is_fresh(gen, wanted, any_tools):
        return gen
    parent.mkdir(parents=True, exist_ok=True)
    with FileLock(parent / "_gen.lock"):
        if is_fresh(gen, wanted, any_tools):  # another process did it while we waited
            return gen
        tmp = Path(tempfile.mkdtemp(prefix="_gen.tmp.", dir=parent))
        old = None
        try:
            generate_into(tmp, root, wanted)
            if gen.exists():
                old = parent / f"_gen.old.{os.getpid()}.{tmp.name.rsplit('.', 1)[-1]}"
                os.rename(gen, old)
            os.rename(tmp, gen)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    return gen
