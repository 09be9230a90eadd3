"""The routing benchmark's deployment (``scripts/bench-routing.py``;
docs/serving.md, "Cache-aware routing"): two vLLM replicas, each with its
OWN kvtier node, and the router in front of them in one of three
configurations.

* Each kvtier node serves its replica on the same-host socket (the
  connector is given the node's gRPC address and moves to its
  ``--local-listen`` socket by itself, as in ``perf.serving.run``).
* The two nodes are one cluster with one copy of each block
  (``--cluster-replicas 1``, docs/cluster.md): a chain's blocks are spread
  over both nodes, so a replica reads some of a prefix from its own node
  and the rest through it from the other.
* Every engine publishes vLLM's KV events (``--kv-events-config``, an
  ``ipc://`` endpoint: nothing listens beyond this host) and every node
  kvtier's (``--kv-events tcp://127.0.0.1:PORT``).

Router configurations (:data:`ROUTERS`): ``round-robin``;
``cache-aware-engine``, scoring on the engines' events only;
``cache-aware-kvtier``, on the engines' and both nodes' events, replica i
reading through node i.

:func:`plan` is the topology as data (ports, arguments, configs), so that
``--dry-run`` records it without starting anything; :func:`deploy` starts
the nodes and engines once, and :meth:`Running.router` starts a router over
them for one configuration.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.server import free_port_pairs

from ..services import Server, ServerError, Service, free_port, kvtier_server
from .engines import Replica, ReplicaSpec, wait_http
from .run import Deployment, System, _connector, _kvtier_args, start_replicas

__all__ = ["ROUTERS", "NodePlan", "Plan", "Running", "RoutingDeployment", "deploy", "kvtier_hits", "plan"]

ROOT = Path(__file__).resolve().parents[2]

ROUTERS = ("round-robin", "cache-aware-engine", "cache-aware-kvtier")

#: kvtier's per-node counters a step keeps (docs/metrics.md).
_KEEP = ("kvtier_tier_hits_total", "kvtier_tier_misses_total", "kvtier_cluster_placement_reads_total",
         "kvtier_tier_written_bytes_total", "kvtier_cluster_forwarded_requests_total")


@dataclass
class NodePlan:
    """One kvtier node: its fixed gRPC port (the cluster's node list names
    every node before any starts), its events and replay endpoints, its arguments."""

    index: int
    port: int
    events: str
    replay: str
    args: list[str]

    @property
    def name(self) -> str:
        """As the cluster and the event topics name it (``--cluster-self`` without the scheme)."""
        return f"127.0.0.1:{self.port}"


@dataclass
class Plan:
    workdir: Path
    run_dir: Path
    """Short-path directory for the unix sockets and vLLM's ``ipc://`` endpoints (108-byte limit)."""
    tiers: str
    nodes: list[NodePlan]
    engine_events: list[str]
    """Each engine's event endpoint; its replay endpoint is the same path + ``-replay``."""
    system: System = field(default_factory=lambda: System("kvtier", kvtier="memory"))

    def engine_args(self, i: int, model: str) -> list[str]:
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.engine_events[i],
               "replay_endpoint": f"{self.engine_events[i]}-replay", "topic": f"kv@replica-{i}@{Path(model).name}"}
        return ["--kv-events-config", json.dumps(cfg)]

    def connector(self, i: int) -> dict[str, Any]:
        return _connector(self.system, self.nodes[i].name, "kv_both", self.workdir / f"connector-{i}.jsonl")

    def router_args(self, router: str, urls: Sequence[str], tokenizer: str, namespace: str = "",
                    weights: Sequence[str] = ()) -> list[str]:
        if router == "round-robin":
            return ["--mode", "round-robin", *urls]
        if router not in ROUTERS:
            raise ValueError(f"unknown router configuration {router!r} (one of {ROUTERS})")
        args = ["--mode", "cache-aware", "--tokenizer", tokenizer, "--log-decisions"]
        for w in weights:
            args += ["--weight", w]
        # Each feed names its publisher's replay endpoint too, so a message
        # ZeroMQ drops (slow joiner, high-water mark) is fetched, not lost.
        for ep in self.engine_events:
            args += ["--engine-events", f"{ep},{ep}-replay"]
        if router == "cache-aware-kvtier":
            for n in self.nodes:
                args += ["--kvtier-events", f"{n.events},{n.replay}", "--replica-node", n.name]
            if namespace:
                args += ["--kvtier-namespace", namespace]
        return [*args, *urls]

    def record(self, model: str = "MODEL") -> dict[str, Any]:
        """The topology for the perf record (what --dry-run writes)."""
        urls = [f"http://127.0.0.1:ENGINE{i}" for i in range(len(self.nodes))]
        return {
            "kvtier_tiers": self.tiers,
            "nodes": [{"name": n.name, "events": n.events, "replay": n.replay, "args": n.args} for n in self.nodes],
            "engines": [{"kv_transfer_config": self.connector(i), "args": self.engine_args(i, model)}
                        for i in range(len(self.nodes))],
            "routers": {r: self.router_args(r, urls, model, "NAMESPACE") for r in ROUTERS},
        }


def plan(workdir: Path, tiers: str = "memory", replicas: int = 2) -> Plan:
    """Picks the ports and writes every argument; starts nothing, creates nothing."""
    ports = free_port_pairs(replicas)  # P for gRPC, P + 1 for the data plane ("auto")
    run_dir = workdir / "ev"
    if len(str(run_dir)) > 80:
        run_dir = Path(tempfile.gettempdir()) / f"kvtier-routing-{os.getpid()}-{secrets.token_hex(3)}"
    members = ",".join(f"grpc://127.0.0.1:{p}" for p in ports)
    nodes = []
    for i, port in enumerate(ports):
        args = _kvtier_args(tiers, workdir / f"node{i}")
        args[args.index("--local-listen") + 1] = str(run_dir / f"n{i}.sock")
        events, replay = (f"tcp://127.0.0.1:{p}" for p in (free_port(), free_port()))
        args += ["--cluster-nodes", members, "--cluster-self", f"grpc://127.0.0.1:{port}", "--cluster-replicas", "1",
                 "--kv-events", events, "--kv-events-replay", replay]
        nodes.append(NodePlan(i, port, events, replay, args))
    return Plan(workdir, run_dir, tiers, nodes, [f"ipc://{run_dir}/engine-{i}" for i in range(replicas)],
                System("kvtier", kvtier=tiers))


def _metric(http: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.split("{", 1)[0].split(" ", 1)[0] == name:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


@dataclass
class RoutingDeployment(Deployment):
    """A :class:`Deployment` whose kvtier is two nodes: their counters, per node."""

    nodes: list[Server] = field(default_factory=list)

    def tier_counters(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, n in enumerate(self.nodes):
            with urllib.request.urlopen(f"http://{n.http}/metrics", timeout=10) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith(_KEEP):
                        name, v = line.rsplit(" ", 1)
                        out[f"node{i}/{name}"] = float(v)
        return out


def kvtier_hits(counters: dict[str, float]) -> dict[str, float]:
    """Blocks kvtier served, summed over the nodes: per tier (``memory``,
    ``disk``, ``object``: where the block was found, on whichever node),
    ``remote`` (found on a node other than the one asked, so also counted in
    that node's tier) and ``misses``."""
    out = {"memory": 0.0, "disk": 0.0, "object": 0.0, "remote": 0.0, "misses": 0.0}
    for key, v in counters.items():
        name = key.split("/", 1)[-1]
        tier = re.search(r'tier="([a-z]+)"', name)
        if name.startswith("kvtier_tier_hits_total") and tier and tier.group(1) in out:
            out[tier.group(1)] += v
        elif name.startswith("kvtier_cluster_placement_reads_total") and 'result="hit"' in name:
            out["remote"] += v
        elif name.startswith("kvtier_tier_misses_total") and tier and tier.group(1) == "memory":
            out["misses"] += v
    return out


@dataclass
class Running:
    """The nodes and engines of a :class:`Plan`, started."""

    plan: Plan
    nodes: list[Server]
    replicas: list[Replica]
    model: str
    namespace: str

    @contextlib.contextmanager
    def router(self, name: str, log: Path, weights: Sequence[str] = ()) -> Iterator[RoutingDeployment]:
        """A router of configuration ``name`` over the engines, stopped on exit."""
        port = free_port()
        args = self.plan.router_args(name, [r.url for r in self.replicas], self.model, self.namespace, weights)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "perf.serving.router", "--port", str(port), *args],
                                    cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/health", proc, 120, log)
            time.sleep(0.5)  # the SUB sockets join (ZeroMQ drops what is published before)
            yield RoutingDeployment(url, self.replicas, None, proc, nodes=self.nodes)
        finally:
            Service(proc).stop()


def _namespaces(logs: Sequence[Path]) -> list[str]:
    """The kvtier namespaces the connectors logged (``kvtier connector: namespace NS, ...``)."""
    found: list[str] = []
    for log in logs:
        text = log.read_text(errors="replace") if log.exists() else ""
        found += [m for m in re.findall(r"kvtier connector: namespace (\S+),", text) if m not in found]
    return found


@contextlib.contextmanager
def deploy(p: Plan, spec: ReplicaSpec, binary: Path | None = None,
           cpus: Sequence[Sequence[int] | None] = (None, None), timeout: float = 900) -> Iterator[Running]:
    """Starts the nodes (waits until each sees the other) and the engines;
    stops everything on exit, whatever happened."""
    p.workdir.mkdir(parents=True, exist_ok=True)
    p.run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, p.run_dir, True)
        nodes = []
        for n in p.nodes:
            node = kvtier_server(binary, args=n.args, listen=f"127.0.0.1:{n.port}")
            stack.callback(node.stop)
            nodes.append(node)
        end = time.monotonic() + 60
        while any(_metric(node.http or "", "kvtier_cluster_members") < len(nodes) for node in nodes):
            if time.monotonic() > end:
                raise ServerError(f"the kvtier nodes did not see each other within 60 s: {p.nodes}")
            time.sleep(0.2)
        specs = [ReplicaSpec(**{**spec.__dict__, "kv_transfer_config": p.connector(i),
                                "extra_args": [*spec.extra_args, *p.engine_args(i, spec.model)],
                                "env": dict(spec.env), "cpus": cpus[i] if i < len(cpus) else None})
                 for i in range(len(p.nodes))]
        replicas = start_replicas(specs, p.workdir, stack, timeout, [str(ROOT / "python")])
        found = _namespaces([r.log for r in replicas])
        # one model: one namespace (several for a hybrid model's groups: their common prefix)
        namespace = os.path.commonprefix(found) if found else ""
        yield Running(p, nodes, replicas, spec.model, namespace)
