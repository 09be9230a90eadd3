"""Stub generation: fresh, relative imports, regenerated on change, safe when concurrent."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import kvtier
from kvtier import _proto

PY_DIR = Path(kvtier.__file__).resolve().parent.parent
REPO = PY_DIR.parent


def test_stubs_are_generated_and_fresh():
    m = _proto.load()
    assert hasattr(m.v1_grpc, "KvTierStub") and hasattr(m.kvstore_grpc, "KVStoreServiceStub")
    assert m.v1.LookupRequest.__module__ == "kvtier._gen.kvtier.v1.kvtier_pb2"
    gen = Path(_proto.PKG_DIR) / "_gen"
    stamp = json.loads((gen / "STAMP.json").read_text())
    assert set(stamp["protos"]) == set(_proto.PROTO_FILES)
    assert _proto._fresh(gen, _proto._wanted_stamp(_proto.proto_dir()))


def test_generated_imports_are_relative():
    gen = Path(_proto.PKG_DIR) / "_gen"
    for f in gen.rglob("*.py"):
        text = f.read_text()
        assert "from kvtier." not in text and "from kvstore " not in text, f
    grpc_mod = (gen / "kvtier" / "v1" / "kvtier_pb2_grpc.py").read_text()
    assert "from . import kvtier_pb2" in grpc_mod


def _copy_tree(tmp: Path) -> Path:
    """A private copy of python/kvtier (without stubs) and proto/ laid out like the repo."""
    shutil.copytree(PY_DIR / "kvtier", tmp / "python" / "kvtier",
                    ignore=shutil.ignore_patterns("_gen", "__pycache__"))
    shutil.copytree(REPO / "proto", tmp / "proto")
    return tmp / "python"


def _import(py: Path, code: str = "import kvtier.pb") -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_PROTO_DIR"}
    env["PYTHONPATH"] = str(py)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=py,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_regenerated_when_proto_changes(tmp_path):
    py = _copy_tree(tmp_path)
    gen = py / "kvtier" / "_gen"
    assert not gen.exists()
    p = _import(py)
    assert p.wait(timeout=120) == 0, p.stderr.read()
    first = json.loads((gen / "STAMP.json").read_text())
    # Unchanged protos: nothing regenerated (same directory inode).
    ino = gen.stat().st_ino
    p = _import(py)
    assert p.wait(timeout=120) == 0, p.stderr.read()
    assert gen.stat().st_ino == ino
    # A changed proto: regenerated, and the new field is there.
    proto = tmp_path / "proto" / "kvtier" / "v1" / "kvtier.proto"
    proto.write_text(proto.read_text().replace(
        "message StatsRequest {}", "message StatsRequest { bool verbose = 1; }"))
    p = _import(py, "import kvtier.pb as pb; pb.v1.StatsRequest(verbose=True)")
    assert p.wait(timeout=120) == 0, p.stderr.read()
    second = json.loads((gen / "STAMP.json").read_text())
    assert second["protos"]["kvtier/v1/kvtier.proto"] != first["protos"]["kvtier/v1/kvtier.proto"]
    assert sorted(x.name for x in (py / "kvtier").iterdir() if x.name.startswith("_gen")) == ["_gen", "_gen.lock"]


def test_concurrent_first_imports(tmp_path):
    py = _copy_tree(tmp_path)
    procs = [_import(py, "import kvtier.pb as pb; pb.v1_grpc.KvTierStub; pb.kvstore_grpc.KVStoreServiceStub")
             for _ in range(4)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    leftovers = [x.name for x in (py / "kvtier").iterdir() if x.name.startswith("_gen")]
    assert sorted(leftovers) == ["_gen", "_gen.lock"]


def test_read_only_package_generates_into_user_cache(tmp_path):
    py = _copy_tree(tmp_path)
    cache = tmp_path / "cache"
    code = (
        "import kvtier._proto as p\n"
        "p._writable = lambda d: False  # as if installed read-only\n"
        "import kvtier.pb as pb, kvtier\n"
        "print(pb.v1.__file__)\n"
    )
    env_code = f"import os; os.environ['XDG_CACHE_HOME'] = {str(cache)!r}\n" + code
    p = _import(py, env_code)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert out.strip().startswith(str(cache / "kvtier")), out
    assert not (py / "kvtier" / "_gen").exists()


_NO_TOOLS = "import sys; sys.modules['grpc_tools'] = None  # grpcio-tools not installed\n"


def test_without_grpcio_tools_fresh_stubs_are_used_and_stale_ones_refused(tmp_path):
    py = _copy_tree(tmp_path)
    p = _import(py, "import kvtier.pb")  # generated with this venv's grpcio-tools
    assert p.wait(timeout=120) == 0, p.stderr.read()
    stamp = (py / "kvtier" / "_gen" / "STAMP.json").read_text()
    # Stubs that match the protos are used as they are.
    p = _import(py, _NO_TOOLS + "import kvtier.pb as pb; pb.v1.StatsRequest()")
    assert p.wait(timeout=120) == 0, p.stderr.read()
    assert (py / "kvtier" / "_gen" / "STAMP.json").read_text() == stamp
    # A changed proto cannot be compiled: a ProtoError that says what to do.
    proto = tmp_path / "proto" / "kvtier" / "v1" / "kvtier.proto"
    proto.write_text(proto.read_text() + "\nmessage Unused {}\n")
    code = _NO_TOOLS + (
        "from kvtier._proto import ProtoError\n"
        "try:\n"
        "    import kvtier.pb\n"
        "except ProtoError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('stale stubs were used')\n"
    )
    p = _import(py, code)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out + err
    assert "older than the .proto files" in out and "python -m kvtier._proto" in out, out


def test_python_m_kvtier_proto_generates(tmp_path):
    py = _copy_tree(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_PROTO_DIR"}
    env["PYTHONPATH"] = str(py)
    r = subprocess.run([sys.executable, "-m", "kvtier._proto"], env=env, cwd=py,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(str(py / "kvtier" / "_gen")), r.stdout
    assert json.loads((py / "kvtier" / "_gen" / "STAMP.json").read_text())["grpcio_tools"]
