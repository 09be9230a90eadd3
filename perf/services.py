"""Starting and stopping what a measurement runs against: kvtier itself
(through the SDK's :class:`kvtier.server.Server`), Redis, MinIO, Azurite and
Mooncake Store. Each is started on loopback (or in a network namespace) with
its own port and directory, probed until ready, and stopped by its own PID:
SIGTERM, then SIGKILL after a timeout.

Binaries are found where ``make setup-test`` puts them (``.tools/``), as the
Rust tests find them (``crates/kvtier-object/src/testing.rs``,
``crates/kvtier-bench/src/competitors/``): ``$KVTIER_MINIO``, ``.tools/bin/minio``,
``~/go/bin/minio``, PATH; ``$KVTIER_AZURITE_BLOB``,
``.tools/azurite/node_modules/azurite/dist/src/blob/main.js``;
``$KVTIER_MOONCAKE_PYTHON``, ``.tools/mooncake/bin/python``; ``redis-server``
on PATH.
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from .header import ROOT, tool_version

try:
    from kvtier.server import Server, ServerError, find_binary
except ImportError:  # a checkout without the SDK installed: the one beside perf/
    sys.path.insert(0, str(ROOT / "python"))
    from kvtier.server import Server, ServerError, find_binary

__all__ = [
    "Azurite", "Minio", "Mooncake", "Redis", "Server", "ServerError", "Service", "find_binary", "free_port",
    "kvtier_server", "release_binary",
]

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
MINIO_USER = "kvtieradmin"
MINIO_PASSWORD = "kvtieradmin-secret"


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (another process may still take it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def release_binary() -> Path:
    """``$KVTIER_BIN``, else target/release/kvtier (what the measurement
    scripts default to: a debug build measures the compiler's settings)."""
    env = os.environ.get("KVTIER_BIN")
    return Path(env) if env else ROOT / "target" / "release" / "kvtier"


def _wait(ready: Callable[[], bool], proc: subprocess.Popen[Any], what: str, timeout: float,
          log: Path | None = None) -> None:
    end = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise ServerError(f"{what} exited with {proc.returncode} before it was ready\n{tail}")
        if time.monotonic() > end:
            raise ServerError(f"{what} not ready after {timeout:g} s" + (f"; see {log}" if log else ""))
        time.sleep(0.05)


def _pinned(cpus: Iterable[int] | None) -> Callable[[], None] | None:
    if cpus is None:
        return None
    cpu_set = set(cpus)
    return lambda: os.sched_setaffinity(0, cpu_set)


class Service:
    """A child process this script started: stopped by its own PID."""

    name = "service"

    def __init__(self, proc: subprocess.Popen[Any], log: Path | None = None):
        self.proc = proc
        self.log = log
        self.returncode: int | None = None
        #: A temporary directory this service was given by start(): removed by stop().
        self.owned_dir: Path | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def _spawn(cls, cmd: Sequence[str], log: Path | None, env: Mapping[str, str] | None = None,
               cpus: Iterable[int] | None = None, wrap: Sequence[str] = (),
               stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen[Any]:
        out: IO[Any] | int = open(log, "ab") if log else subprocess.DEVNULL  # closed once the child has it
        try:
            return subprocess.Popen([*wrap, *cmd], stdin=stdin, stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, **(env or {})}, preexec_fn=_pinned(cpus))
        except OSError as e:
            raise ServerError(f"cannot run {shlex.join(cmd)}: {e} (run `make setup-test`)") from e
        finally:
            if not isinstance(out, int):
                out.close()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGCONT (a paused process takes no SIGTERM), SIGTERM, wait at most
        ``timeout`` seconds, then SIGKILL. Returns the exit code."""
        if self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.kill(self.proc.pid, sig)
                except ProcessLookupError:
                    break
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.returncode = self.proc.returncode
        if self.owned_dir is not None:
            shutil.rmtree(self.owned_dir, ignore_errors=True)
            self.owned_dir = None
        return self.returncode

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- kvtier ----------------------------------------------------------------------


def kvtier_server(binary: str | os.PathLike[str] | None = None, args: Sequence[str] = (),
                  cpus: Iterable[int] | None = None, config: str | None = None,
                  env: Mapping[str, str | None] | None = None, listen: str = "127.0.0.1:0",
                  wrap: Sequence[str] = (), timeout: float = 60.0) -> Server:
    """``kvtier serve`` started by the SDK's :meth:`Server.start`: ready once
    it prints its addresses (``server.grpc``, ``server.ready["data"]``,
    ``server.http``), stopped with ``server.stop()``.

    ``binary``: default :func:`release_binary`. ``cpus``: started pinned, so
    its runtime sizes itself to them (pinning a running server leaves every
    worker on fewer cores, notes/028). ``config``: TOML text, passed as
    ``--config``. ``env``: added to this process's environment
    (``_RJEM_MALLOC_CONF``, say; ``None`` removes a variable). ``wrap``: a command prefix that execs the
    server, such as ``["ip", "netns", "exec", NS]``; the server keeps the
    PID it is started with, so it is still stopped by its own PID.
    """
    exe = Path(binary) if binary is not None else release_binary()
    if not exe.is_file():
        raise ServerError(f"{exe} not found: cargo build --release -p kvtier (or pass the binary)")
    tmp = Path(tempfile.mkdtemp(prefix="kvtier-perf-"))
    try:
        extra = list(args)
        if config is not None:
            (tmp / "kvtier.toml").write_text(config)
            extra = ["--config", str(tmp / "kvtier.toml"), *extra]
        if wrap:
            # Server.start runs `BINARY serve ...`: a script that execs the wrapped binary.
            script = tmp / "kvtier"
            script.write_text(f'#!/bin/sh\nexec {shlex.join([*wrap, str(exe.resolve())])} "$@"\n')
            script.chmod(0o755)
            exe = script
        full = None
        if env:
            full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
        return Server.start(binary=exe, args=extra, timeout=timeout, listen=listen, cpus=cpus, env=full)
    finally:
        # Read at start: the config and the wrapper are not needed once it is ready.
        shutil.rmtree(tmp, ignore_errors=True)


# -- Redis -----------------------------------------------------------------------


class Redis(Service):
    """A private ``redis-server``: no persistence, ``maxmemory`` with
    ``allkeys-lru`` (2 GiB by default: kvtier's default memory tier, as
    ``kvtier bench --peer redis://spawn`` starts it)."""

    name = "redis"

    def __init__(self, proc: subprocess.Popen[Any], port: int, host: str, log: Path | None):
        super().__init__(proc, log)
        self.host, self.port = host, port

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"

    @classmethod
    def start(cls, cpus: Iterable[int] | None = None, maxmemory: str = "2gb", port: int | None = None,
              host: str = "127.0.0.1", directory: str | os.PathLike[str] | None = None,
              args: Sequence[str] = (), log: Path | None = None, timeout: float = 10.0) -> Redis:
        port = port or free_port(host)
        cmd = ["redis-server", "--port", str(port), "--bind", host, "--save", "", "--appendonly", "no",
               "--protected-mode", "no", "--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru",
               *(["--dir", str(directory)] if directory is not None else []), *args]
        proc = cls._spawn(cmd, log, cpus=cpus)
        r = cls(proc, port, host, log)
        try:
            _wait(r.ping, proc, "redis-server", timeout, log)
        except BaseException:
            r.stop()
            raise
        return r

    def ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @staticmethod
    def version() -> str | None:
        return tool_version("redis-server")


# -- object-store emulators --------------------------------------------------------


def _http_status(host: str, port: int, method: str, path: str, headers: Mapping[str, str] | None = None) -> int | None:
    try:
        c = http.client.HTTPConnection(host, port, timeout=2)
        c.request(method, path, headers=dict(headers or {}))
        status = c.getresponse().status
        c.close()
        return status
    except OSError:
        return None


def minio_binary() -> Path:
    env = os.environ.get("KVTIER_MINIO")
    found = shutil.which("minio")
    for p in (env, ROOT / ".tools/bin/minio", Path.home() / "go/bin/minio", found):
        if p and Path(p).is_file():
            return Path(p)
    raise ServerError("MinIO not found in .tools/bin, ~/go/bin or PATH (or $KVTIER_MINIO): run `make setup-test`")


class Minio(Service):
    """MinIO (S3) with the development credentials kvtier's tests use."""

    name = "minio"
    user, password = MINIO_USER, MINIO_PASSWORD

    def __init__(self, proc: subprocess.Popen[Any], host: str, port: int, directory: Path, log: Path | None):
        super().__init__(proc, log)
        self.host, self.port, self.dir = host, port, directory

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @classmethod
    def start(cls, directory: str | os.PathLike[str] | None = None, host: str = "127.0.0.1",
              port: int | None = None, console_port: int | None = None, wrap: Sequence[str] = (),
              log: Path | None = None, probe: bool = True, timeout: float = 60.0) -> Minio:
        """``probe=False`` where this process cannot reach it (started in
        another network namespace): call :meth:`create_bucket` from where it can."""
        d = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="kvtier-minio-"))
        port = port or free_port(host)
        console = console_port or free_port(host)
        cmd = [str(minio_binary()), "server", str(d / "data"), "--address", f"{host}:{port}",
               "--console-address", f"{host}:{console}", "--quiet"]
        env = {"MINIO_ROOT_USER": MINIO_USER, "MINIO_ROOT_PASSWORD": MINIO_PASSWORD, "MINIO_BROWSER": "off",
               "MINIO_UPDATE": "off"}
        m = cls(cls._spawn(cmd, log, env=env, wrap=wrap), host, port, d, log)
        m.owned_dir = d if directory is None else None
        if probe:
            try:
                _wait(m.ready, m.proc, "MinIO", timeout, log)
            except BaseException:
                m.stop(30)
                raise
        return m

    def ready(self) -> bool:
        return _http_status(self.host, self.port, "GET", "/minio/health/ready") == 200

    def create_bucket(self, bucket: str, timeout: float = 60.0) -> None:
        """PUT /BUCKET signed with AWS SigV4 (object_store never creates buckets)."""
        create_bucket(self.host, self.port, bucket, timeout)

    def options(self) -> dict[str, str]:
        """``[object_store.options]`` for kvtier with an ``s3://`` URL."""
        return {"aws_endpoint": self.endpoint, "aws_allow_http": "true", "aws_access_key_id": MINIO_USER,
                "aws_secret_access_key": MINIO_PASSWORD, "aws_region": "us-east-1"}

    @staticmethod
    def version() -> str | None:
        try:
            return tool_version("minio", minio_binary())
        except ServerError:
            return None


def create_bucket(host: str, port: int, bucket: str, timeout: float = 60.0) -> None:
    """Waits for MinIO at ``host:port`` to be ready, then creates ``bucket``
    (an existing one is fine)."""
    end = time.monotonic() + timeout
    while _http_status(host, port, "GET", "/minio/health/ready") != 200:
        if time.monotonic() > end:
            raise ServerError(f"MinIO at {host}:{port} did not become ready")
        time.sleep(0.1)
    while True:
        amz_date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        date = amz_date[:8]
        hosthdr = f"{host}:{port}"
        ph = hashlib.sha256(b"").hexdigest()
        canonical = (f"PUT\n/{bucket}\n\nhost:{hosthdr}\nx-amz-content-sha256:{ph}\nx-amz-date:{amz_date}\n\n"
                     f"host;x-amz-content-sha256;x-amz-date\n{ph}")
        scope = f"{date}/us-east-1/s3/aws4_request"
        sts = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        k = hmac.new(f"AWS4{MINIO_PASSWORD}".encode(), date.encode(), hashlib.sha256).digest()
        for part in ("us-east-1", "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
        st = _http_status(host, port, "PUT", f"/{bucket}", {
            "Host": hosthdr, "x-amz-content-sha256": ph, "x-amz-date": amz_date, "Content-Length": "0",
            "Authorization": f"AWS4-HMAC-SHA256 Credential={MINIO_USER}/{scope}, "
                             f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={sig}"})
        if st in (200, 409):
            return
        if st == 503 and time.monotonic() < end:  # MinIO answers 503 for a moment after ready
            time.sleep(0.1)
            continue
        raise ServerError(f"creating bucket {bucket}: HTTP {st}")


def azurite_main() -> Path:
    env = os.environ.get("KVTIER_AZURITE_BLOB")
    p = Path(env) if env else ROOT / ".tools/azurite/node_modules/azurite/dist/src/blob/main.js"
    if not p.is_file():
        raise ServerError(f"Azurite not found at {p} (or $KVTIER_AZURITE_BLOB): run `make setup-test`")
    return p


class Azurite(Service):
    """Azurite's blob service with its well-known development account."""

    name = "azurite"
    account, key = AZURITE_ACCOUNT, AZURITE_KEY

    def __init__(self, proc: subprocess.Popen[Any], port: int, directory: Path, log: Path | None):
        super().__init__(proc, log)
        self.port, self.dir = port, directory

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"

    @classmethod
    def start(cls, directory: str | os.PathLike[str] | None = None, port: int | None = None,
              log: Path | None = None, timeout: float = 60.0) -> Azurite:
        d = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="kvtier-azurite-"))
        d.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        cmd = ["node", str(azurite_main()), "--blobHost", "127.0.0.1", "--blobPort", str(port),
               "--location", str(d), "--skipApiVersionCheck", "--loose", "--silent"]
        a = cls(cls._spawn(cmd, log), port, d, log)
        a.owned_dir = d if directory is None else None
        try:
            # Any HTTP answer means the blob service is listening.
            _wait(lambda: _http_status("127.0.0.1", port, "GET", f"/{AZURITE_ACCOUNT}?comp=list") is not None,
                  a.proc, "Azurite", timeout, log)
        except BaseException:
            a.stop(30)
            raise
        return a

    def create_container(self, name: str) -> None:
        """PUT the container with a SharedKey signature (201, or 409: it exists)."""
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")
        path = f"/{AZURITE_ACCOUNT}/{name}"
        sts = ("PUT\n" + "\n" * 11 + f"x-ms-date:{date}\nx-ms-version:2021-08-06\n/{AZURITE_ACCOUNT}{path}\n"
               "restype:container")
        sig = base64.b64encode(hmac.new(base64.b64decode(AZURITE_KEY), sts.encode(), hashlib.sha256).digest())
        st = _http_status("127.0.0.1", self.port, "PUT", f"{path}?restype=container", {
            "x-ms-date": date, "x-ms-version": "2021-08-06", "Content-Length": "0",
            "Authorization": f"SharedKey {AZURITE_ACCOUNT}:{sig.decode()}"})
        if st not in (201, 409):
            raise ServerError(f"Azurite refused to create container {name}: HTTP {st}")

    def options(self) -> dict[str, str]:
        """``[object_store.options]`` for kvtier with an ``az://`` URL."""
        return {"azure_storage_account_name": AZURITE_ACCOUNT, "azure_storage_account_key": AZURITE_KEY,
                "azure_storage_endpoint": self.endpoint, "azure_allow_http": "true"}

    @staticmethod
    def version() -> str | None:
        return tool_version("azurite")


# -- Mooncake Store ----------------------------------------------------------------

MOONCAKE_DRIVER = ROOT / "crates/kvtier-bench/src/competitors/mooncake_driver.py"


def venv_python(env_var: str, default: str, what: str, how: str) -> Path:
    """A peer's own venv interpreter: ``$env_var``, else ``ROOT/default``;
    a clear error naming ``how`` to install it when missing."""
    env = os.environ.get(env_var)
    p = Path(env) if env else ROOT / default
    if not p.exists():
        raise ServerError(f"{what} is not installed ({p}): {how} (or set {env_var})")
    return p


def mooncake_python() -> Path:
    return venv_python("KVTIER_MOONCAKE_PYTHON", ".tools/mooncake/bin/python", "Mooncake Store",
                       "run scripts/setup-mooncake.sh")


class Mooncake(Service):
    """A Mooncake Store cluster (``mooncake_master`` and a process holding
    its memory segment), started by ``kvtier bench``'s own driver
    (``mooncake_driver.py cluster``), which stops both when its stdin closes.
    ``info``: ``{"master", "metadata", "pids", "version", ...}``."""

    name = "mooncake"

    def __init__(self, proc: subprocess.Popen[Any], info: dict[str, Any], log: Path | None):
        super().__init__(proc, log)
        self.info = info
        self._tmp: Path | None = None

    @classmethod
    def start(cls, mem_bytes: int = 2 << 30, log: Path | None = None, timeout: float = 90.0,
              cpus: Iterable[int] | None = None) -> Mooncake:
        """``cpus``: the driver starts pinned, so the master and the segment
        holder it starts are pinned with it (children inherit affinity)."""
        tmp = Path(tempfile.mkdtemp(prefix="kvtier-mooncake-"))
        ready = tmp / "ready.json"
        cmd = [str(mooncake_python()), str(MOONCAKE_DRIVER), "cluster", "--mem", str(mem_bytes),
               "--ready-file", str(ready), *(["--log", str(log)] if log else [])]
        proc = cls._spawn(cmd, None, cpus=cpus, stdin=subprocess.PIPE)
        m = cls(proc, {}, log)
        m._tmp = tmp  # the driver's log is there unless `log` is given: kept until stop()
        try:
            _wait(lambda: ready.exists() and ready.stat().st_size > 0, proc, "the Mooncake cluster", timeout,
                  log or Path(f"{ready}.log"))
            m.info = json.loads(ready.read_text())
        except BaseException:
            m.stop(15)
            raise
        return m

    def stop(self, timeout: float = 15.0) -> int | None:
        """Closes the driver's stdin (it stops what it started), then as :meth:`Service.stop`."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        code = super().stop(timeout)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        return code

    def version(self) -> str | None:
        return str(self.info.get("version") or "") or tool_version("mooncake")
