"""The package as users get it: a wheel built from python/ ships the gRPC stubs
(generated at build time by setup.py) and imports without grpcio-tools.

The wheel is built the way pip builds it for a user, with build isolation
(the build requirements, setuptools and the pinned grpcio-tools, come from the
package registry), from a private copy of python/ and proto/ so that the
checkout's own kvtier/_gen and build/ neither leak into the wheel nor get
overwritten. Nothing is skipped: a build that cannot run fails the test.
"""
from __future__ import annotations

import email.parser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import PYTHON_DIR, REPO_ROOT

STUBS = [
    "kvtier/_gen/STAMP.json",
    "kvtier/_gen/kvtier/v1/kvtier_pb2.py",
    "kvtier/_gen/kvtier/v1/kvtier_pb2.pyi",
    "kvtier/_gen/kvtier/v1/kvtier_pb2_grpc.py",
    "kvtier/_gen/kvtier/v1/wire_pb2.py",
    "kvtier/_gen/kvstore/kvstore_pb2.py",
    "kvtier/_gen/kvstore/kvstore_pb2_grpc.py",
]


def _build_requires() -> list[Requirement]:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    data = tomllib.loads((PYTHON_DIR / "pyproject.toml").read_text())
    return [Requirement(r) for r in data["build-system"]["requires"]]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(
        PYTHON_DIR, src / "python",
        ignore=shutil.ignore_patterns(
            "_gen", "_gen.*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "tests"),
    )
    shutil.copytree(REPO_ROOT / "proto", src / "proto")
    out = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_PROTO_DIR"}
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
         str(src / "python"), "-w", str(out)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    wheels = list(out.glob("kvtier-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_ships_the_generated_stubs(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for stub in STUBS:
            assert stub in names, f"{stub} missing from {wheel.name}"
        grpc_mod = z.read("kvtier/_gen/kvtier/v1/kvtier_pb2_grpc.py").decode()
        assert "from . import kvtier_pb2" in grpc_mod, "imports between stubs are relative"
        assert "kvtier/_protogen.py" in names and "kvtier/py.typed" in names
        assert not [n for n in names if "_gen.lock" in n or "_gen.tmp" in n or "_gen.old" in n]


def test_wheel_needs_no_grpcio_tools_and_matches_its_stubs(wheel):
    """Runtime dependencies: no grpcio-tools, and floors no lower than what the shipped stubs check for."""
    with zipfile.ZipFile(wheel) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
        pb2 = z.read("kvtier/_gen/kvtier/v1/kvtier_pb2.py").decode()
        grpc_mod = z.read("kvtier/_gen/kvtier/v1/kvtier_pb2_grpc.py").decode()
    runtime = [Requirement(r) for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    by_name = {r.name: r for r in runtime}
    assert "grpcio-tools" not in by_name, runtime
    assert any(r.name == "grpcio-tools" for r in _build_requires())
    m = re.search(r"^# Protobuf Python Version: (\S+)$", pb2, re.MULTILINE)
    assert m, "generated module names its protobuf version"
    g = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'$", grpc_mod, re.MULTILINE)
    assert g, "generated grpc module names its grpcio version"
    for name, generated in (("protobuf", Version(m.group(1))), ("grpcio", Version(g.group(1)))):
        floors = [Version(s.version) for s in by_name[name].specifier if s.operator in (">=", "==")]
        assert floors and min(floors) >= generated, (
            f"the wheel's stubs need {name}>={generated}, its metadata allows {by_name[name]}")


def test_installed_wheel_imports_without_grpcio_tools(wheel, tmp_path):
    target = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
         "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    gen = target / "kvtier" / "_gen"
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in gen.rglob("*.py*")}
    code = (
        "import importlib.util, sys\n"
        "sys.modules['grpc_tools'] = None  # as if grpcio-tools were not installed\n"
        "assert importlib.util.find_spec('grpc_tools') is None\n"
        "import kvtier, kvtier.pb as pb\n"
        "from kvtier import Client\n"
        "print(kvtier.__file__)\n"
        "print(pb.v1.__file__)\n"
        "print(pb.v1_grpc.KvTierStub.__module__, pb.wire.WireReadRequest.__module__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("KVTIER_PROTO_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(target)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == str(target / "kvtier" / "__init__.py"), "imported the installed wheel, not the checkout"
    assert lines[1] == str(gen / "kvtier" / "v1" / "kvtier_pb2.py")
    assert lines[2] == "kvtier._gen.kvtier.v1.kvtier_pb2_grpc kvtier._gen.kvtier.v1.wire_pb2"
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in gen.rglob("*.py*")}
    assert after == before, "the shipped stubs were used as they are, not regenerated"
    assert not (tmp_path / "cache").exists(), "nothing generated into the user cache"


def test_missing_stubs_without_grpcio_tools_explain_what_to_do(wheel, tmp_path):
    """An installation that lost its stubs (and has no protos or grpcio-tools) raises ProtoError."""
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(target)
    shutil.rmtree(target / "kvtier" / "_gen")
    code = (
        "import sys\n"
        "sys.modules['grpc_tools'] = None\n"
        "import kvtier\n"
        "try:\n"
        "    import kvtier.pb\n"
        "except kvtier.Error as e:\n"
        "    from kvtier._proto import ProtoError\n"
        "    assert isinstance(e, ProtoError) and isinstance(e, ImportError), type(e)\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('imported without stubs')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("KVTIER_PROTO_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(target)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "pip install" in r.stdout and "python -m kvtier._proto" in r.stdout, r.stdout
