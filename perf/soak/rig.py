"""The soak's rig (``scripts/soak.py``): one kvtier server on memory + disk
+ MinIO, its disk tier on a tmpfs of its own, its store behind a proxy that
can black-hole; and the faults done to it. One lifetime per server process,
each with its descriptor counts (docs/durability.md, "A soak with faults").
"""
from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from ..services import Minio, Server, free_port, kvtier_server
from .faults import BlackHoleProxy, Tmpfs, stall_put
from .schedule import Fault

__all__ = ["FD_SLACK", "READ_TIMEOUT_S", "Rig", "count_fds", "inject"]

#: The HTTP namespace of the stalled uploads.
STALL_NS = "soak-stall"
#: server.read_timeout in the soak's config: a stalled upload is cut off after it.
READ_TIMEOUT_S = 4
MEMORY_MIB, DISK_MIB, TMPFS_MIB = 128, 160, 256
#: Descriptors a lifetime may end with above its start: pooled store and
#: client connections come and go (docs/durability.md, "A soak with faults").
FD_SLACK = 64
#: Content-Length of a stalled upload; half of it is sent.
STALL_LENGTH = 24 << 20


def config(disk_dir: Path, store: Minio, proxy: BlackHoleProxy) -> str:
    # The store is reached through the proxy, so a partition is one call away.
    opts = {**store.options(), "aws_endpoint": proxy.endpoint}
    lines = "\n".join(f'{k} = "{v}"' for k, v in sorted(opts.items()))
    return f"""[server]
read_timeout = "{READ_TIMEOUT_S}s"
[engine]
memory_capacity = "{MEMORY_MIB}MiB"
[disk]
dir = "{disk_dir}"
capacity = "{DISK_MIB}MiB"
sync = "always"
write_policy = "write-through"
[object_store]
url = "s3://soak/blocks"
write_policy = "write-through"
timeout = "3s"
request_timeout = "2s"
connect_timeout = "1s"
lookup_timeout = "1s"
[object_store.options]
{lines}
"""


def count_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Rig:
    """The server, its store behind the proxy, its tmpfs; one lifetime per server process."""

    def __init__(self, binary: Path, work: Path):
        self.binary, self.work = binary, work
        self.minio_dir, self.minio_port = work / "minio", free_port()
        self.minio: Minio | None = None
        self.proxy: BlackHoleProxy | None = None
        self.fs: Tmpfs | None = None
        self._server: Server | None = None
        self.lifetimes: list[dict[str, Any]] = []
        try:
            self.minio = Minio.start(directory=self.minio_dir, port=self.minio_port, log=work / "minio.log")
            self.minio.create_bucket("soak")
            self.proxy = BlackHoleProxy(("127.0.0.1", self.minio_port))
            self.fs = Tmpfs(work / "disk-fs", TMPFS_MIB)
            self.config = config(self.fs.path / "disk", self.minio, self.proxy)
            from kvtier.server import free_port_pair  # importable once perf.services is (it finds the SDK)

            self.port = free_port_pair()
            self._server = self._start()
        except BaseException:
            self.close()
            raise

    @property
    def server(self) -> Server:
        assert self._server is not None, "started in __init__"
        return self._server

    @server.setter
    def server(self, s: Server) -> None:
        self._server = s

    def _start(self) -> Server:
        t0 = time.monotonic()
        s = kvtier_server(self.binary, config=self.config, listen=f"127.0.0.1:{self.port}")
        self.lifetimes.append({"pid": s.pid, "start_after_s": round(time.monotonic() - t0, 3), "fds_start": None,
                               "fds_end": None, "fds_max": 0, "rss_max_mib": 0.0, "ended_by": None})
        return s

    def measure_fds(self, end: bool, why: str = "") -> None:
        life = self.lifetimes[-1]
        n = count_fds(self.server.pid)
        life["fds_end" if end else "fds_start"] = n
        life["_t_end" if end else "_t_start"] = time.monotonic()
        if end:
            life["ended_by"] = why

    def kill_restart(self, down_s: float) -> dict[str, Any]:
        self.measure_fds(end=True, why="SIGKILL")
        os.kill(self.server.pid, signal.SIGKILL)
        self.server.stop()
        time.sleep(down_s)
        self.server = self._start()
        return {"killed": self.lifetimes[-2]["pid"], "restarted": self.server.pid,
                "ready_after_s": self.lifetimes[-1]["start_after_s"]}

    @property
    def store_proxy(self) -> BlackHoleProxy:
        assert self.proxy is not None, "started in __init__"
        return self.proxy

    @property
    def disk_fs(self) -> Tmpfs:
        assert self.fs is not None, "started in __init__"
        return self.fs

    def stop_store(self) -> None:
        assert self.minio is not None
        self.minio.stop(30)
        self.minio = None

    def start_store(self) -> None:
        self.minio = Minio.start(directory=self.minio_dir, port=self.minio_port, log=self.work / "minio.log")

    def resident_limit_mib(self) -> tuple[float, str]:
        """The server's own ``server.resident_limit`` (its /metrics gauge),
        else what the config derives it to (docs/operations.md, "Memory")."""
        try:
            with urllib.request.urlopen(f"http://{self.server.http}/metrics", timeout=5) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("kvtier_resident_limit_bytes "):
                        return float(line.split()[1]) / 2**20, "kvtier_resident_limit_bytes"
        except OSError:
            pass
        request = max(MEMORY_MIB / 4, 64)
        return MEMORY_MIB * 1.1 + request + 64, "memory tier x 1.1 + request_memory + 64 MiB"

    def close(self) -> None:
        """Everything this rig started, in order (the tmpfs last: the server holds it); idempotent."""
        if self._server is not None and self._server.running:
            self._server.stop()
        if self.proxy is not None:
            self.proxy.close()
        if self.minio is not None:
            self.minio.stop(30)
            self.minio = None
        if self.fs is not None:
            self.fs.unmount()


def inject(rig: Rig, f: Fault, end: float) -> dict[str, Any]:
    """Runs fault ``f`` until ``end`` (monotonic) and heals it; what happened."""
    info: dict[str, Any] = {}
    if f.kind == "kill_restart":
        info = rig.kill_restart(down_s=min(2.0, f.length_s / 4))
    elif f.kind == "store_stop":
        rig.stop_store()
        time.sleep(max(0.0, end - time.monotonic()))
        t = time.monotonic()
        rig.start_store()
        info = {"store_ready_after_s": round(time.monotonic() - t, 2)}
    elif f.kind == "disk_full":
        info = rig.disk_fs.fill()
        time.sleep(max(0.0, end - time.monotonic()))
        rig.disk_fs.drain()
    elif f.kind == "partition":
        rig.store_proxy.partition()
        time.sleep(max(0.0, end - time.monotonic()))
        rig.store_proxy.heal()
    elif f.kind == "stall_client":
        info = {"stalls": stall_clients(rig, end)}
    time.sleep(max(0.0, end - time.monotonic()))
    return info


def stall_clients(rig: Rig, end: float) -> list[dict[str, Any]]:
    """Two uploads at a time that stop half way, renewed until ``end``."""
    out: list[dict[str, Any]] = []

    def one(n: int) -> None:
        while time.monotonic() < end:
            http = rig.server.http
            assert http is not None
            out.append(stall_put(http, f"/v1/kv/{STALL_NS}/s{n}-{len(out)}", STALL_LENGTH, STALL_LENGTH // 2,
                                 give_up_s=READ_TIMEOUT_S + 6))

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
