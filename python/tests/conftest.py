"""Fixtures: the real kvtier binary (built once per session if missing) and servers."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

PYTHON_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = PYTHON_DIR.parent
if str(PYTHON_DIR) not in sys.path:
    sys.path.insert(0, str(PYTHON_DIR))

from kvtier.server import Server  # noqa: E402


def load_script(filename: str, module: str) -> ModuleType:
    """scripts/FILENAME as module MODULE, for tests of a script's pure
    functions. Scripts run as ``python3 scripts/NAME.py``: their shim
    (``_perf``) is found on scripts/, and their names are not module names."""
    scripts = REPO_ROOT / "scripts"
    if str(scripts) not in sys.path:
        sys.path.insert(0, str(scripts))
    spec = importlib.util.spec_from_file_location(module, scripts / filename)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: Largest block the ``small_server`` accepts.
SMALL_MAX_BLOCK = 1 << 20


@pytest.fixture(scope="session")
def kvtier_bin() -> Path:
    """``$KVTIER_BIN``, else target/debug/kvtier, built with ``cargo build -p kvtier`` if missing."""
    env = os.environ.get("KVTIER_BIN")
    if env:
        return Path(env)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO_ROOT / "target")
    binary = target / "debug" / "kvtier"
    if not binary.is_file():
        r = subprocess.run(
            ["cargo", "build", "-p", "kvtier"], cwd=REPO_ROOT, timeout=3600,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        if r.returncode != 0:
            pytest.fail(f"cargo build -p kvtier failed:\n{r.stdout[-4000:]}")
        assert binary.is_file(), f"cargo build -p kvtier did not produce {binary}"
    return binary


@pytest.fixture(scope="session")
def server(kvtier_bin):
    """A kvtier server with default settings, shared by the session (tests use their own namespaces)."""
    s = Server.start(binary=kvtier_bin)
    yield s
    assert s.stop() == 0, "graceful exit on SIGTERM"


@pytest.fixture(scope="session")
def small_server(kvtier_bin):
    """A server started with --max-block-size 1MiB."""
    s = Server.start(binary=kvtier_bin, args=["--max-block-size", "1MiB"])
    yield s
    assert s.stop() == 0


@pytest.fixture
def client(server):
    from kvtier import Client

    c = Client(server.grpc, connections=2, timeout=30.0)
    yield c
    c.close()


@pytest.fixture
def ns(request) -> str:
    """A namespace unique to this test."""
    return f"test-{request.node.name[:60]}-{uuid.uuid4().hex[:8]}".replace("[", "_").replace("]", "_")
