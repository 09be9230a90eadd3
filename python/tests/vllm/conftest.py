"""Fixtures for the vLLM connector tests: locally built models, a real engine
in a fresh process per scenario (``engine_run.py``), reading the
connector's stats log, and the unit tests' stand-ins for vLLM's KV caches,
requests and scheduler output (test_units_*.py).

These tests run in vLLM's own venv (``.tools/vllm``, ``scripts/setup-vllm.sh``)
and need no GPU and no downloads: the models are created here with random
weights (``kvtier.vllm.testing``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvtier.server import free_port_pair, free_port_pairs  # noqa: F401  (re-exported for the tests)

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "engine_run.py"

#: Tolerance on float32 logprobs: a load from kvtier must reproduce
#: recomputation's logprobs (notes/009 measured at most 2.9e-6).
TOL = 1e-4

#: Block size (tokens) of the unit tests' caches and chains.
BS = 128


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Two random-weight Llama models of the same shape, different weights."""
    from kvtier.vllm.testing import make_model

    root = tmp_path_factory.mktemp("models")
    return {"m1": str(make_model(root / "m1", "small", seed=0)), "m2": str(make_model(root / "m2", "small", seed=1))}


class Engine:
    """One engine process running ``spec`` (see engine_run.py)."""

    def __init__(self, spec: dict, workdir: Path, env: dict | None = None):
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.spec_path = self.dir / "spec.json"
        self.out_path = self.dir / "out.json"
        self.log_path = self.dir / "engine.log"
        self.spec_path.write_text(json.dumps(spec))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(RUNNER), str(self.spec_path), str(self.out_path)],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )

    def wait(self, timeout: float = 900) -> dict:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"engine did not finish within {timeout}s; log tail:\n{self.text()[-6000:]}")
        self.log.close()
        assert rc == 0, f"engine exited with {rc}; log tail:\n{self.text()[-8000:]}"
        return json.loads(self.out_path.read_text())

    def wait_file(self, path: Path, timeout: float = 600) -> dict:
        """Waits (probing) for a phase's ``done`` file; fails if the engine dies first."""
        end = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None:
                pytest.fail(f"engine exited ({self.proc.returncode}) before {path.name}; log tail:\n{self.text()[-8000:]}")
            if time.monotonic() > end:
                pytest.fail(f"{path.name} not written within {timeout}s")
            time.sleep(0.05)
        return json.loads(path.read_text())

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_engine(spec: dict, workdir: Path, env: dict | None = None) -> tuple[dict, str]:
    e = Engine(spec, workdir, env)
    return e.wait(), e.text()


def stats(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(path: Path, event: str, **match) -> list[dict]:
    return [e for e in stats(path) if e["event"] == event and all(e.get(k) == v for k, v in match.items())]


def outputs(result: dict) -> list[dict]:
    """Every request's output, phase after phase."""
    return [o for ph in result["phases"] for o in ph["outputs"]]


def assert_same_logprobs(got: dict, want: dict, what: str) -> None:
    """Generated tokens' float32 logprobs equal within TOL (same top tokens)."""
    assert len(got["logprobs"]) == len(want["logprobs"]), what
    worst = 0.0
    for step, (g, w) in enumerate(zip(got["logprobs"], want["logprobs"])):
        common = set(g) & set(w)
        assert common, f"{what}: step {step} shares no top token: {g} vs {w}"
        for tok in common:
            worst = max(worst, abs(g[tok] - w[tok]))
    assert worst <= TOL, f"{what}: logprobs differ by {worst:.2e} > {TOL} (got {got['token_ids']}, want {want['token_ids']})"


def wait_blocks(client, namespace: str, keys: list[bytes], timeout: float = 60) -> int:
    """Probes kvtier until all ``keys`` are present (saves are asynchronous)."""
    end = time.monotonic() + timeout
    found = 0
    while time.monotonic() < end:
        found = client.lookup(namespace, keys=keys).found
        if found == len(keys):
            return found
        time.sleep(0.05)
    return found


def make_caches(layers=3, blocks=6, heads=2, n=BS, c=16, dtype=None, seed=0) -> dict:
    """vLLM-shaped KV caches ``{layer: [blocks, heads, n, c]}`` of seeded random values (float32 by default)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {f"l{i}": torch.randn(blocks, heads, n, c, generator=g).to(dtype or torch.float32) for i in range(layers)}


class FakeRequest:
    """A stand-in for vLLM's ``Request``: the fields the scheduler side reads."""

    def __init__(self, rid, tokens, preemptions=0):
        self.request_id = rid
        self.all_token_ids = list(tokens)
        self.num_prompt_tokens = len(tokens)
        self.num_preemptions = preemptions
        self.lora_request = None
        self.mm_features = []
        self.prompt_embeds = None
        self.cache_salt = None
        self.kv_transfer_params = None

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


def sched_output(new=(), cached=(), scheduled=None):
    """A SchedulerOutput stand-in: new = [(req_id, computed)], cached = [(req_id, computed)]."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=c) for r, c in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached], num_computed_tokens=[c for _, c in cached]),
        num_scheduled_tokens=scheduled or {},
        scheduled_spec_decode_tokens={},
    )
