"""Build hooks: the gRPC stubs are generated when the package is built.

Everything else about the package is in pyproject.toml. ``build_py`` compiles
the repository's ``proto/`` with grpcio-tools (a build requirement, pinned in
pyproject.toml, not a runtime dependency) into ``build/lib/kvtier/_gen``, so a
wheel ships its stubs and installing it needs no grpcio-tools. An editable
install (``pip install -e python``) generates into the source tree's
``kvtier/_gen`` instead (gitignored), unless stubs for the current protos are
already there; at run time kvtier._proto regenerates them when the protos
change and grpcio-tools is installed.

An sdist carries a copy of ``proto/`` (the proto files live outside this
directory in the repository), so a wheel can be built from it.

``kvtier._native``, the Rust client core as an extension module
(crates/kvtier-py), is built by ``scripts/build-native.sh`` into
``kvtier/_native.abi3.so`` when it is missing and the repository's crates are
beside this directory (a checkout; cargo compiles it once for every venv),
and ships in the wheel, which is then tagged for CPython >= 3.11's stable ABI
on this platform. Built where there are no crates (an sdist), the package has
no native core and reads and writes over gRPC (kvtier.dataplane says why).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
NATIVE = HERE / "kvtier" / "_native.abi3.so"
BUILD_NATIVE = HERE.parent / "scripts" / "build-native.sh"


def _ensure_native() -> None:
    """Builds kvtier/_native.abi3.so from the repository's crates if it is missing."""
    if NATIVE.exists() or not BUILD_NATIVE.exists() or not (HERE.parent / "crates" / "kvtier-py").is_dir():
        return
    subprocess.run([str(BUILD_NATIVE)], check=True, env={**os.environ, "PYTHON": sys.executable})


class NativeDistribution(Distribution):
    """A distribution that is not pure Python when it carries the native core."""

    def has_ext_modules(self) -> bool:
        return NATIVE.exists()


def _protogen() -> ModuleType:
    """kvtier/_protogen.py, loaded by path: importing ``kvtier`` would need its runtime dependencies."""
    spec = importlib.util.spec_from_file_location("_kvtier_protogen", HERE / "kvtier" / "_protogen.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _proto_root(gen: ModuleType) -> Path:
    candidates = [Path(os.environ["KVTIER_PROTO_DIR"])] if os.environ.get("KVTIER_PROTO_DIR") else []
    # The repository's proto/ (building from a checkout), else the copy an sdist carries.
    candidates += [HERE.parent / "proto", HERE / "proto"]
    root = gen.find_proto_dir(candidates)
    if root is None:
        raise SystemExit(f"kvtier: no proto files ({', '.join(gen.PROTO_FILES)}) in {candidates}")
    return root


class BuildPyWithStubs(build_py):
    """``build_py`` that also generates ``kvtier/_gen`` from the proto files."""

    def run(self) -> None:
        _ensure_native()
        super().run()
        gen = _protogen()
        root = _proto_root(gen)
        wanted = gen.wanted_stamp(root)
        if self.editable_mode:
            # Stubs any grpcio-tools made from the same protos will do: a
            # development venv may have made them with its own version.
            gen.ensure_at(HERE / "kvtier", root, wanted, any_tools=True)
            return
        out = Path(self.build_lib) / "kvtier" / "_gen"
        shutil.rmtree(out, ignore_errors=True)  # never ship stubs left from an earlier build
        out.mkdir(parents=True)
        gen.generate_into(out, root, wanted)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        gen_dir = Path(self.build_lib) / "kvtier" / "_gen"
        if not self.editable_mode and gen_dir.is_dir():
            outputs += [str(p) for p in sorted(gen_dir.rglob("*")) if p.is_file()]
        return outputs


class SdistWithProtos(sdist):
    """``sdist`` that also carries the proto files, as ``proto/`` beside setup.py."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        gen = _protogen()
        root = _proto_root(gen)
        for f in gen.PROTO_FILES:
            dest = Path(base_dir) / "proto" / f
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / f, dest)


_ensure_native()
setup(
    cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos},
    distclass=NativeDistribution,
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if NATIVE.exists() else {},
)
