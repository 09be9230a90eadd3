"""One serving configuration, deployed and measured: kvtier (if the system
uses it), the engine replicas of a topology, the router, and vLLM's
benchmark client at each request rate.

Topologies (docs/serving.md):

* ``one``: one engine behind the router (same extra hop as the others);
* ``two``: two engines behind a round-robin router: with an odd number of
  users, consecutive turns of a conversation land on different replicas;
* ``pd``: a prefill engine (``kv_producer``) and a decode engine
  (``kv_consumer``) behind the prefill/decode router; kvtier carries the
  prefill's KV to the decoder.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..services import Server, Service, free_port, kvtier_server
from .engines import Replica, ReplicaSpec, http_json, wait_http

__all__ = ["Deployment", "System", "TOPOLOGIES", "check_outputs", "deploy", "run_rate"]

TOPOLOGIES = ("one", "two", "pd")

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class System:
    """What sits beside vLLM: nothing, kvtier on some tiers, or a peer connector."""

    name: str
    kvtier: str | None = None
    """``memory`` or ``disk`` (a memory tier smaller than the working set, over a disk tier)."""
    kvtier_args: list[str] = field(default_factory=list)
    """Added to ``kvtier serve``'s arguments (an admission policy, say: notes/065)."""
    peer: Callable[[Path], contextlib.AbstractContextManager[tuple[dict[str, Any], dict[str, str], list[str]]]] | None = None
    """A peer's set-up (``perf.serving.peers``): yields (kv_transfer_config, env, PYTHONPATH entries)."""
    connector: tuple[str, str] = ("KvtierConnector", "kvtier.vllm")
    """kvtier's connector class and module (tests put a variant here)."""
    env: dict[str, str] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)
    """Added to the engines' environment and PYTHONPATH."""


@dataclass
class Deployment:
    router: str
    replicas: list[Replica]
    kvtier: Server | None
    router_proc: subprocess.Popen[Any]
    stats_files: list[Path] = field(default_factory=list)

    def counters(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for r in self.replicas:
            for k, v in r.metrics().items():
                total[k] = total.get(k, 0.0) + v
        return total

    def tier_counters(self) -> dict[str, float]:
        """kvtier's per-tier write and admission counters (docs/metrics.md); {} without kvtier."""
        if self.kvtier is None or not self.kvtier.http:
            return {}
        with urllib.request.urlopen(f"http://{self.kvtier.http}/metrics", timeout=10) as r:
            text = r.read().decode()
        keep = ("kvtier_tier_written_bytes_total", "kvtier_tier_admission_blocks_total", "kvtier_tier_hits_total",
                "kvtier_tier_misses_total")
        return {name: float(v) for name, v in (line.rsplit(" ", 1) for line in text.splitlines()
                                               if line.startswith(keep))}


def _kvtier_args(kind: str, workdir: Path) -> list[str]:
    sock = workdir / "kvtier.sock"
    if kind == "memory":
        return ["--memory-capacity", "4GiB", "--local-listen", str(sock)]
    if kind == "disk":
        return ["--memory-capacity", "16MiB", "--disk-dir", str(workdir / "disk"), "--disk-capacity", "8GiB",
                "--local-listen", str(sock)]
    raise ValueError(f"unknown kvtier tiers {kind!r}")


def _connector(system: System, url: str, role: str, stats: Path) -> dict[str, Any]:
    return {"kv_connector": system.connector[0], "kv_connector_module_path": system.connector[1], "kv_role": role,
            "kv_connector_extra_config": {"url": url, "stats_file": str(stats)}}


@contextlib.contextmanager
def deploy(system: System, topology: str, spec: ReplicaSpec, workdir: Path, kvtier_binary: Path | None = None,
           cpus: Sequence[Sequence[int] | None] = (None, None), timeout: float = 900) -> Iterator[Deployment]:
    """Starts everything; stops it all on exit, whatever happened."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r} (one of {TOPOLOGIES})")
    if topology == "pd" and system.kvtier is None:
        raise ValueError("the prefill/decode topology needs kvtier to carry the KV")
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        server = None
        ktc: list[dict[str, Any] | None] = [None, None]
        env: dict[str, str] = dict(system.env)
        path = [*system.path, str(ROOT / "python")]
        stats = [workdir / "connector-0.jsonl", workdir / "connector-1.jsonl"]
        if system.kvtier is not None:
            server = kvtier_server(kvtier_binary, args=[*_kvtier_args(system.kvtier, workdir), *system.kvtier_args])
            stack.callback(server.stop)
            roles = ("kv_producer", "kv_consumer") if topology == "pd" else ("kv_both", "kv_both")
            ktc = [_connector(system, server.grpc, roles[i], stats[i]) for i in range(2)]
        elif system.peer is not None:
            cfg, penv, ppath = stack.enter_context(system.peer(workdir / "peer"))
            from .peers import replica_config

            ktc = [replica_config(cfg, 0), replica_config(cfg, 1)]
            env.update(penv)
            path += ppath
        n = 1 if topology == "one" else 2
        specs = [ReplicaSpec(**{**spec.__dict__, "kv_transfer_config": ktc[i], "env": {**spec.env, **env},
                                "cpus": cpus[i] if i < len(cpus) else None}) for i in range(n)]
        replicas = start_replicas(specs, workdir, stack, timeout, path)
        port = free_port()
        mode = ["--mode", "pd", "--prefill", replicas[0].url, "--decode", replicas[1].url] if topology == "pd" \
            else ["--mode", "round-robin", *[r.url for r in replicas]]
        log = open(workdir / "router.log", "ab")
        stack.callback(log.close)
        router = subprocess.Popen([sys.executable, "-m", "perf.serving.router", "--port", str(port), *mode],
                                  cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        stack.callback(Service(router).stop)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", router, 60, workdir / "router.log")
        yield Deployment(url, replicas, server, router, stats[:n] if server else [])


def start_replicas(specs: Sequence[ReplicaSpec], workdir: Path, stack: contextlib.ExitStack, timeout: float,
                   extra_path: Sequence[str] = ()) -> list[Replica]:
    """Spawns every replica (logging to ``workdir/engine-I.log``, each
    stopped when ``stack`` closes) before waiting for any, so they load in
    parallel; then waits for each and warms it up."""
    replicas = []
    for i, s in enumerate(specs):
        r = Replica.spawn(s, workdir / f"engine-{i}.log", extra_path=extra_path)
        stack.callback(r.stop)
        replicas.append(r)
    for r in replicas:
        r.ready(timeout)
    for r, s in zip(replicas, specs):
        warm_up(r.url, s.model)
    return replicas


def warm_up(url: str, model: str, requests: int = 3) -> None:
    """A few requests unrelated to any trace, so that the first measured
    requests do not pay the engine's first-use costs (allocations, kernel
    selection): on the tiny model they took seconds."""
    for i in range(requests):
        body = json.dumps({"model": model, "prompt": f"warm up {i} " * (40 + 60 * i), "max_tokens": 2}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()


def check_outputs(dep: Deployment, model: str, trace: Path, n: int) -> list[dict[str, Any]]:
    """The last ``n`` prompts of ``trace`` once more, greedy, 2 tokens with
    their top-5 logprobs: compared across systems by the report (every
    system must give vLLM alone's first tokens)."""
    prompts = [json.loads(line)["prompt"] for line in trace.read_text().splitlines() if line.strip()][-n:]
    out = []
    for prompt in prompts:
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0.0,
                           "logprobs": 5}).encode()
        req = urllib.request.Request(dep.router + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            choice = json.loads(r.read())["choices"][0]
        out.append({"text": choice["text"], "top_logprobs": choice["logprobs"]["top_logprobs"]})
    return out


def run_rate(dep: Deployment, model: str, trace: Path, requests: int, rate: float, out: Path,
             timeout: float = 1800, output_len: int | None = None) -> dict[str, Any]:
    """vLLM's benchmark client against the router at ``rate`` requests/s
    (Poisson arrivals, seed 0, the trace's order); the step's record.

    ``output_len``: the client's ``--custom-output-len``. None leaves its
    default, 256 tokens per request, which overrides the trace's
    ``output_tokens`` (what bench-serving has always run); -1 takes each
    request's ``output_tokens`` from the trace."""
    out.mkdir(parents=True, exist_ok=True)
    before, tiers_before = dep.counters(), dep.tier_counters()
    routed_before = http_json(dep.router + "/stats")["requests"]
    name = f"bench-{rate:g}.json"
    cmd = [sys.executable, "-m", "perf.serving.client", "--backend", "vllm", "--base-url", dep.router,
           "--endpoint", "/v1/completions", "--model", model, "--tokenizer", model,
           "--dataset-name", "custom", "--dataset-path", str(trace), "--disable-shuffle", "--skip-chat-template",
           "--num-prompts", str(requests), "--request-rate", f"{rate:g}", "--seed", "0", "--ignore-eos",
           "--ready-check-timeout-sec", "0", "--num-warmups", "0", "--disable-tqdm",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
           "--save-result", "--result-dir", str(out), "--result-filename", name]
    if output_len is not None:
        cmd += ["--custom-output-len", str(output_len)]
    t0 = time.monotonic()
    with open(out / f"client-{rate:g}.log", "wb") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        tail = (out / f"client-{rate:g}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"vllm bench serve exited with {proc.returncode}:\n{tail}")
    after, tiers_after = dep.counters(), dep.tier_counters()
    result = json.loads((out / name).read_text())
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    routed = {k: v - routed_before.get(k, 0) for k, v in http_json(dep.router + "/stats")["requests"].items()}
    prompt = delta.get("prompt_tokens", 0.0)
    keep = ("completed", "failed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
            "total_input_tokens", "total_output_tokens")
    step: dict[str, Any] = {k: result.get(k) for k in keep}
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p50", "p90", "p99"):
            key = f"{stat}_{m}_ms"
            if key in result:
                step[key] = result[key]
    step.update({
        "request_rate": rate,
        "wall_s": time.monotonic() - t0,
        "engine_counters": delta,
        "kvtier_counters": {k: v - tiers_before.get(k, 0.0) for k, v in tiers_after.items()},
        "routed": routed,
        "local_hit_rate": delta.get("local_hits", 0.0) / prompt if prompt else 0.0,
        "external_hit_rate": delta.get("external_hits", 0.0) / prompt if prompt else 0.0,
        "hit_rate": (delta.get("local_hits", 0.0) + delta.get("external_hits", 0.0)) / prompt if prompt else 0.0,
    })
    return step
