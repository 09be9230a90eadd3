"""A three-node kvtier cluster in network namespaces, with faults to inject
(used by test_partitions.py; docs/cluster.md "Partitions and pauses").

    root namespace: this process (the client), MinIO on 10.A.B.1
        bridge kvpb<tag> ── veth ── namespace kvpart-<tag>-n1: kvtier on 10.A.B.11:50051
                         ├─ veth ── namespace kvpart-<tag>-n2: kvtier on 10.A.B.12:50051
                         └─ veth ── namespace kvpart-<tag>-n3: kvtier on 10.A.B.13:50051

Every node reaches the object store and the client reaches every node
through the bridge. A fault cuts IP traffic between nodes only:

* **drop(src, dsts)**: packets from ``src`` to each of ``dsts`` are dropped
  silently. This kernel has neither iptables nor nft, and tc has no
  classifiers (notes/015: no netem either), so the drop is made in ``src``'s
  neighbour table: a permanent entry gives each destination's IP a MAC no
  interface has, so ``src``'s frames to it go nowhere while every other path
  (the client, MinIO, the reverse direction) is untouched. Silent, like a
  real partition: new connections hang in SYN, established ones stall.
* **heal()**: the entries are removed; the neighbours are learned again by ARP.
* **pause(i) / resume(i)**: SIGSTOP / SIGCONT to node ``i``'s own PID.

Everything the lab creates has a per-run tag in its name and is removed by
``close()`` (namespaces, the bridge and its veths, processes by their PIDs).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from kvtier.server import REPO_ROOT, Server

if str(REPO_ROOT) not in sys.path:  # perf/ (the MinIO and kvtier starters) lives at the root
    sys.path.insert(0, str(REPO_ROOT))

from perf.services import Minio, ServerError, kvtier_server, minio_binary

PORT = 50051
BUCKET = "kvtier"
#: A locally administered MAC that no interface in the lab has: frames sent to it are dropped.
NOWHERE_MAC = "02:00:5e:00:de:ad"


def missing_tools() -> list[str]:
    """What the lab needs and this machine lacks (the test fails with it, never skips)."""
    out = []
    if os.geteuid() != 0:
        out.append("root (network namespaces, veths, a bridge)")
    out += [f"`{t}` (iproute2)" for t in ("ip",) if shutil.which(t) is None]
    try:
        minio_binary()
    except ServerError as e:
        out.append(f"MinIO ({e})")
    return out


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(args, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"$ {' '.join(args)}\n{r.stdout}{r.stderr}")
    return r


class ClusterLab:
    """Three kvtier nodes, one per namespace, sharing a MinIO bucket. Use as a context manager."""

    def __init__(self, binary: Path, cluster: dict[str, str], n: int = 3):
        pid = os.getpid()
        self.tag = f"{pid % 100000}"
        # A /24 per run, one this machine does not route yet.
        routes = sh("ip", "-4", "route", "show", check=False).stdout
        self.net = next(n for n in (f"10.{200 + (pid + k) % 50}.{(pid // 50 + k) % 250}" for k in range(100))
                        if f"{n}." not in routes)
        self.bridge = f"kvpb{self.tag}"
        self.host_ip = f"{self.net}.1"
        self.ns = [f"kvpart-{self.tag}-n{i + 1}" for i in range(n)]
        self.ips = [f"{self.net}.{11 + i}" for i in range(n)]
        self.veth = [f"kvp{self.tag}n{i + 1}" for i in range(n)]
        self.binary = binary
        #: ``[cluster]`` keys other than nodes/self (TOML values as text), e.g. ``{"peer_timeout": '"400ms"'}``.
        self.cluster = cluster
        # Memory-backed where there is one: MinIO's and the disk tiers' thousands of small
        # files cost tens of seconds to write and remove on a busy CI disk, and no fault here is a disk's.
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.dir = Path(tempfile.mkdtemp(prefix="kvtier-partitions-", dir=shm))
        self.minio: Minio | None = None
        self.servers: list[Server | None] = [None] * n
        self.paused: set[int] = set()
        self.drops: list[tuple[int, int]] = []

    @property
    def addrs(self) -> list[str]:
        """The nodes' gRPC addresses (their names in placement)."""
        return [f"{ip}:{PORT}" for ip in self.ips]

    # -- set-up and tear-down ---------------------------------------------------

    def __enter__(self) -> ClusterLab:
        try:
            self._network()
            self.minio = Minio.start(self.dir / "minio", host=self.host_ip, log=self.dir / "minio.log")
            self.minio.create_bucket(BUCKET)
            for i in range(len(self.ns)):
                self.start(i)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _network(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for ns, ip, veth in zip(self.ns, self.ips, self.veth):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", veth, "master", self.bridge, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def config(self, i: int) -> str:
        assert self.minio is not None, "started in __enter__"
        opts = "\n".join(f'{k} = "{v}"' for k, v in self.minio.options().items())
        nodes = ", ".join(f'"grpc://{a}"' for a in self.addrs)
        extra = "\n".join(f"{k} = {v}" for k, v in self.cluster.items())
        return f"""
[server]
data_listen = "{self.ips[i]}:{PORT + 1}"

[engine]
memory_capacity = "64MiB"

[disk]
dir = "{self.dir / f'n{i + 1}' / 'disk'}"
capacity = "256MiB"

[object_store]
url = "s3://{BUCKET}/partitions"
timeout = "3s"
request_timeout = "2s"
connect_timeout = "500ms"
max_retries = 1

[object_store.options]
{opts}

[cluster]
nodes = [{nodes}]
self = "grpc://{self.addrs[i]}"
replicas = 2
{extra}
"""

    def start(self, i: int) -> Server:
        """Starts node ``i`` in its namespace (the server keeps the PID it was started with)."""
        # --insecure: a lab network only this run reaches (docs/security.md).
        s = kvtier_server(self.binary, args=["--insecure"], config=self.config(i), listen=self.addrs[i],
                          wrap=["ip", "netns", "exec", self.ns[i]], env={"NO_COLOR": "1"})
        self.servers[i] = s
        return s

    def close(self) -> None:
        """Stops every process the lab started, by its PID, and removes what it created."""
        for i, s in enumerate(self.servers):
            if s is None:
                continue
            if s.running:
                os.kill(s.pid, signal.SIGCONT)  # a stopped process takes no SIGTERM
            try:
                s.stop(timeout=15)
            except Exception:  # noqa: BLE001 - stop() kills it after its timeout; keep tearing down
                pass
            self.servers[i] = None
        if self.minio is not None:
            self.minio.stop(15)
            self.minio = None
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)  # its end of the veth goes with it, and so the pair
        sh("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """Namespaces and links of this run still present (none after close())."""
        nss = sh("ip", "netns", "list", check=False).stdout
        links = sh("ip", "-o", "link", "show", check=False).stdout
        return [n for n in self.ns if n in nss] + [x for x in (self.bridge, *self.veth) if f" {x}:" in links
                                                   or f" {x}@" in links]

    def log(self, i: int) -> str:
        s = self.servers[i]
        return s.stderr_text() if s is not None else ""

    # -- faults -----------------------------------------------------------------

    def drop(self, src: int, dsts: list[int]) -> None:
        """Drops every packet from node ``src`` to the nodes ``dsts`` (see the module doc)."""
        for d in dsts:
            sh("ip", "-n", self.ns[src], "neigh", "replace", self.ips[d], "lladdr", NOWHERE_MAC,
               "dev", "eth0", "nud", "permanent")
            self.drops.append((src, d))

    def cut_out(self, i: int) -> None:
        """Packets from node ``i`` to the other nodes are dropped (one way)."""
        self.drop(i, [j for j in range(len(self.ns)) if j != i])

    def cut_in(self, i: int) -> None:
        """Packets from the other nodes to node ``i`` are dropped (one way)."""
        for j in range(len(self.ns)):
            if j != i:
                self.drop(j, [i])

    def isolate(self, i: int) -> None:
        """Node ``i`` and the other nodes no longer reach each other; the client and MinIO reach all."""
        self.cut_out(i)
        self.cut_in(i)

    def heal(self) -> None:
        for src, d in self.drops:
            sh("ip", "-n", self.ns[src], "neigh", "del", self.ips[d], "dev", "eth0", check=False)
        self.drops.clear()

    def pause(self, i: int) -> None:
        s = self.servers[i]
        assert s is not None and s.running, f"node {i + 1} runs"
        os.kill(s.pid, signal.SIGSTOP)
        self.paused.add(i)

    def resume(self, i: int) -> None:
        s = self.servers[i]
        assert s is not None, f"node {i + 1} was started"
        os.kill(s.pid, signal.SIGCONT)
        self.paused.discard(i)

    def reaches(self, src: int, dst: int, timeout: float = 1.0) -> bool:
        """Whether node ``src``'s namespace opens a TCP connection to node ``dst``'s gRPC port."""
        code = (f"import socket\ntry:\n socket.create_connection(('{self.ips[dst]}', {PORT}), timeout={timeout})"
                "\nexcept OSError:\n raise SystemExit(1)")
        r = subprocess.run(["ip", "netns", "exec", self.ns[src], sys.executable, "-c", code],
                           capture_output=True, timeout=timeout + 30)
        return r.returncode == 0
