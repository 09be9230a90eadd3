"""Generates the gRPC stubs from ``proto/`` on first use.

The stubs live in ``kvtier/_gen/`` (gitignored), laid out like ``proto/``::

    _gen/kvtier/v1/kvtier_pb2.py, kvtier_pb2_grpc.py, kvtier_pb2.pyi, wire_pb2.py (data plane)
    _gen/kvstore/kvstore_pb2.py, kvstore_pb2_grpc.py, kvstore_pb2.pyi
    _gen/STAMP.json

They are (re)generated when missing or when the proto files or the
grpcio-tools version differ from what ``STAMP.json`` records (content hashes,
not mtimes: a fresh git checkout gives every file a new mtime). Generation
runs ``grpc_tools.protoc`` into a temporary directory beside ``_gen``, rewrites
the generated modules' absolute imports of each other (``from kvtier.v1 import
kvtier_pb2``, which would resolve against *this* package) into relative ones,
writes the stamp and then renames the directory into place, all under an
inter-process file lock, so concurrent first imports (pytest-xdist, several
workers) neither see a half-written tree nor race.

Where the package directory is read-only (an installed wheel without stubs),
the stubs are generated into a per-user cache directory instead and that
directory is put first on ``kvtier.__path__``.

Environment: ``KVTIER_PROTO_DIR`` overrides where the ``.proto`` files are
looked for (default: the repository's ``proto/`` two levels above this file).
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

from ._error import Error

__all__ = ["PROTO_FILES", "ensure_generated", "load", "proto_dir"]

#: The proto files compiled, relative to the proto root.
PROTO_FILES = ("kvtier/v1/kvtier.proto", "kvtier/v1/wire.proto", "kvstore/kvstore.proto")
_TOP_LEVEL = {p.split("/", 1)[0] for p in PROTO_FILES}
_STAMP = "STAMP.json"
_STAMP_FORMAT = 2

PKG_DIR = Path(__file__).resolve().parent
_lock = threading.Lock()
_loaded: SimpleNamespace | None = None


class ProtoError(Error, ImportError):
    """The stubs are missing and cannot be generated."""


def proto_dir() -> Path | None:
    """Where the ``.proto`` files are, or ``None`` if they cannot be found."""
    candidates = []
    env = os.environ.get("KVTIER_PROTO_DIR")
    if env:
        candidates.append(Path(env))
    candidates += [PKG_DIR.parent.parent / "proto", PKG_DIR / "proto"]
    for c in candidates:
        if all((c / f).is_file() for f in PROTO_FILES):
            return c
    return None


def _tools_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("grpcio-tools")
    except Exception:
        return None


def _wanted_stamp(root: Path) -> dict:
    return {
        "format": _STAMP_FORMAT,
        "grpcio_tools": _tools_version(),
        "protos": {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in PROTO_FILES},
    }


def _read_stamp(gen: Path) -> dict | None:
    try:
        return json.loads((gen / _STAMP).read_text())
    except (OSError, ValueError):
        return None


def _fresh(gen: Path, wanted: dict | None) -> bool:
    have = _read_stamp(gen)
    if have is None or have.get("format") != _STAMP_FORMAT:
        return False
    if wanted is None:  # no protos to compare with: take what is there
        return True
    if have.get("protos") != wanted["protos"]:
        return False
    # Regenerate for a different protoc, but only if one is there to do it.
    return wanted["grpcio_tools"] is None or have.get("grpcio_tools") == wanted["grpcio_tools"]


_BUILD_RE = re.compile(r"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'[\w.]+'(, _globals\))")
_IMPORT_RE = re.compile(r"^(?P<indent>[ \t]*)from (?P<mod>[A-Za-z_][\w.]*) import ", re.M)


def _relativize(path: Path, root: Path) -> None:
    """Rewrites ``from kvtier.v1 import x`` in a generated module into ``from . import x``."""
    pkg = list(path.relative_to(root).parent.parts)
    text = path.read_text()

    def repl(m: re.Match) -> str:
        target = m.group("mod").split(".")
        if target[0] not in _TOP_LEVEL:
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


def _generate_into(out: Path, root: Path, wanted: dict) -> None:
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise ProtoError(
            "kvtier: the gRPC stubs are not generated and grpcio-tools is not installed "
            "(pip install grpcio-tools)"
        ) from e
    import importlib.resources as resources

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
        raise ProtoError(f"kvtier: grpc_tools.protoc failed with exit code {rc}: {' '.join(args)}")
    for d in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        (d / "__init__.py").touch()
    for f in list(out.rglob("*.py")) + list(out.rglob("*.pyi")):
        _relativize(f, out)
    (out / _STAMP).write_text(json.dumps(wanted, indent=1, sort_keys=True) + "\n")


class _FileLock:
    """An exclusive inter-process lock (fcntl where available; no-op elsewhere)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return self
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _writable(d: Path) -> bool:
    return os.access(d, os.W_OK | os.X_OK)


def _cache_base(wanted: dict) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvtier"
    digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]
    return base / f"gen-{digest}"


def _ensure_at(parent: Path, root: Path, wanted: dict) -> Path:
    gen = parent / "_gen"
    if _fresh(gen, wanted):
        return gen
    parent.mkdir(parents=True, exist_ok=True)
    with _FileLock(parent / "_gen.lock"):
        if _fresh(gen, wanted):  # another process did it while we waited
            return gen
        tmp = Path(tempfile.mkdtemp(prefix="_gen.tmp.", dir=parent))
        old = None
        try:
            _generate_into(tmp, root, wanted)
            if gen.exists():
                old = parent / f"_gen.old.{os.getpid()}.{tmp.name.rsplit('.', 1)[-1]}"
                os.rename(gen, old)
            os.rename(tmp, gen)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    return gen


def ensure_generated() -> Path:
    """Makes sure up-to-date stubs exist; returns the ``_gen`` directory used."""
    root = proto_dir()
    wanted = _wanted_stamp(root) if root is not None else None
    local = PKG_DIR / "_gen"
    if wanted is None:
        if _fresh(local, None):
            return local
        raise ProtoError(
            "kvtier: no generated stubs in kvtier/_gen and no proto files found; "
            "set KVTIER_PROTO_DIR to the directory holding kvtier/v1/kvtier.proto"
        )
    if _fresh(local, wanted) or _writable(PKG_DIR):
        return _ensure_at(PKG_DIR, root, wanted)
    # Read-only install: generate into a per-user cache and look there first.
    parent = _cache_base(wanted)
    gen = _ensure_at(parent, root, wanted)
    pkg = sys.modules[__package__]
    if str(parent) not in pkg.__path__:
        pkg.__path__.insert(0, str(parent))
    return gen


def load() -> SimpleNamespace:
    """Generates if needed and imports the stub modules.

    Returns a namespace with ``v1`` (kvtier.v1 messages), ``v1_grpc`` (its
    stub/servicer), ``kvstore`` and ``kvstore_grpc``.
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is None:
            ensure_generated()
            base = f"{__package__}._gen"
            _loaded = SimpleNamespace(
                v1=importlib.import_module(f"{base}.kvtier.v1.kvtier_pb2"),
                v1_grpc=importlib.import_module(f"{base}.kvtier.v1.kvtier_pb2_grpc"),
                wire=importlib.import_module(f"{base}.kvtier.v1.wire_pb2"),
                kvstore=importlib.import_module(f"{base}.kvstore.kvstore_pb2"),
                kvstore_grpc=importlib.import_module(f"{base}.kvstore.kvstore_pb2_grpc"),
            )
    return _loaded
