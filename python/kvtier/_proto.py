"""Loads the generated gRPC stubs (``kvtier._gen``), built when the package is built.

Where the stubs come from:

* **An installed package** (a wheel, ``pip install /path/to/kvtier/python``):
  the build ran ``grpc_tools.protoc`` (``python/setup.py``, grpcio-tools is a
  build requirement only) and the wheel ships ``kvtier/_gen``. Nothing is
  generated at import time and grpcio-tools is not needed.
* **A development checkout** (``PYTHONPATH=python``, or ``pip install -e
  python``): ``kvtier/_gen`` is gitignored. When the stubs are missing, or
  older than the ``.proto`` files in the repository's ``proto/`` (content
  hashes, see :mod:`kvtier._protogen`), or made by another grpcio-tools
  version than the one installed, they are regenerated on first use, **if
  grpcio-tools is importable**; the test environments install it
  (python/requirements-dev.txt, scripts/setup-vllm.sh, scripts/setup-lmcache.sh).
  Without grpcio-tools, stubs that match the protos are used as they are and
  missing or stale ones raise :class:`ProtoError`. ``python -m kvtier._proto``
  (or ``make py-stubs``) generates them explicitly.

Where the package directory is read-only (a checkout one cannot write to),
the stubs are generated into a per-user cache directory instead and that
directory is put first on ``kvtier.__path__``.

Environment: ``KVTIER_PROTO_DIR`` overrides where the ``.proto`` files are
looked for (default: the repository's ``proto/`` two levels above this file);
an installed package finds none and uses the stubs it shipped.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

from . import _protogen
from ._protogen import PROTO_FILES, Stamp
from .errors import Error

__all__ = ["PROTO_FILES", "ProtoError", "ensure_generated", "load", "proto_dir"]

PKG_DIR = Path(__file__).resolve().parent
_lock = threading.Lock()
_loaded: SimpleNamespace | None = None

#: How to get stubs, for error messages.
_HOW = (
    "install the package (pip install /path/to/kvtier/python, which builds the stubs), or in a "
    "checkout install grpcio-tools and run `python -m kvtier._proto` (make py-stubs)"
)


class ProtoError(Error, ImportError):
    """The stubs are missing or stale and cannot be generated."""


def proto_dir() -> Path | None:
    """Where the ``.proto`` files are, or ``None`` if they cannot be found."""
    candidates = []
    env = os.environ.get("KVTIER_PROTO_DIR")
    if env:
        candidates.append(Path(env))
    candidates += [PKG_DIR.parent.parent / "proto", PKG_DIR / "proto"]
    return _protogen.find_proto_dir(candidates)


def _wanted_stamp(root: Path) -> Stamp:
    return _protogen.wanted_stamp(root)


def _fresh(gen: Path, wanted: Stamp | None) -> bool:
    return _protogen.is_fresh(gen, wanted)


def _writable(d: Path) -> bool:
    return os.access(d, os.W_OK | os.X_OK)


def _cache_base(wanted: Stamp) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvtier"
    digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]
    return base / f"gen-{digest}"


def _ensure_at(parent: Path, root: Path, wanted: Stamp) -> Path:
    if not _protogen.is_fresh(parent / "_gen", wanted) and wanted["grpcio_tools"] is None:
        raise ProtoError(
            f"kvtier: the gRPC stubs in {parent / '_gen'} are missing or older than the .proto files "
            f"in {root}, and grpcio-tools is not installed to generate them: {_HOW}"
        )
    try:
        return _protogen.ensure_at(parent, root, wanted)
    except _protogen.GenerateError as e:
        raise ProtoError(f"kvtier: cannot generate the gRPC stubs: {e}") from e


def ensure_generated() -> Path:
    """Makes sure usable stubs exist; returns the ``_gen`` directory used."""
    root = proto_dir()
    local = PKG_DIR / "_gen"
    if root is None:
        if _fresh(local, None):
            return local
        raise ProtoError(
            f"kvtier: no generated gRPC stubs in {local} and no .proto files to generate them from "
            f"(set KVTIER_PROTO_DIR to the directory holding kvtier/v1/kvtier.proto): {_HOW}"
        )
    wanted = _wanted_stamp(root)
    if _fresh(local, wanted) or _writable(PKG_DIR):
        return _ensure_at(PKG_DIR, root, wanted)
    # Read-only package directory: generate into a per-user cache and look there first.
    parent = _cache_base(wanted)
    gen = _ensure_at(parent, root, wanted)
    pkg = sys.modules[__package__]
    if str(parent) not in pkg.__path__:
        pkg.__path__.insert(0, str(parent))
    return gen


def load() -> SimpleNamespace:
    """Generates if needed (development checkouts only) and imports the stub modules.

    Returns a namespace with ``v1`` (kvtier.v1 messages), ``v1_grpc`` (its
    stub/servicer), ``wire`` (the data plane's metadata messages), ``kvstore``
    and ``kvstore_grpc``.
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


def main() -> int:
    """``python -m kvtier._proto``: (re)generates the stubs of this checkout and says where."""
    try:
        gen = ensure_generated()
    except ProtoError as e:
        print(e, file=sys.stderr)
        return 1
    stamp = _protogen.read_stamp(gen) or {}
    print(f"{gen} (grpcio-tools {stamp.get('grpcio_tools')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
