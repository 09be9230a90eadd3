#!/usr/bin/env python3
"""Mooncake Store driver for `kvtier bench` (the `mooncake://spawn` competitor).

Embedded in the Rust bench (competitors/mooncake.rs, include_str!) and run with the
Python of .tools/mooncake (scripts/setup-mooncake.sh). Self-contained: stdlib
plus the `mooncake` package. Results are JSON on stdout; diagnostics go to
stderr. Every wait has a deadline.

Subcommands:
  cluster --mem BYTES --ready-file PATH [--log PATH] [--timeout S]
      Starts mooncake_master (RPC, embedded HTTP metadata server and metrics
      on 127.0.0.1, ephemeral ports) and a segment-holding store client that
      contributes BYTES of memory (the store's capacity). When a probe client
      has put, read back and removed a key over TCP, writes the ready JSON:
      {"master", "metadata", "protocol", "pids", "version", "segment_bytes",
       "log", "listen": {role: ["addr:port", ...]}, "startup_s"}
      then runs until SIGTERM/SIGINT or until its stdin (when a pipe) closes,
      stops its children by PID and exits 0. Children get PR_SET_PDEATHSIG,
      so they die with it even when it is SIGKILLed.
  run --master HOST:P --metadata URL --op put|get --concurrency C
      --duration S --warmup S --value-size N [--keys K]
      [--api buffer|bytes] [--workers threads|processes]
      Closed-loop load of C workers. put: every op writes a new key. get:
      preloads K keys, reads them round-robin and checks length and the
      per-key stamp in the first and last 8 bytes. Prints
      {"op", "api", "concurrency", "workers", "duration_s", "ops", "errors",
       "error_samples", "latencies_us", "generator_cpu_s", "value_size", "keys"}
      ops counts every op completed in the measured window (errors included);
      latencies_us has one entry per op, in completion order. Afterwards the
      run removes its keys (remove_by_regex, force) unless --keep: Mooncake
      evicts only objects whose lease (10 s after a put or get) has expired,
      so leftovers would crowd out the next run's keys.
      Threads share one client (the binding releases the GIL in put_from,
      get_into, put and get); --workers processes gives each its own client.
      Note: this wheel's client busy-polls for transfer completion, so every
      in-flight op keeps a core busy (generator_cpu_s shows it).
  reference ...   Mooncake's own store benchmark, when the installed package
      ships one; this one does not (see reference()), so it exits 3.
  version         {"version": "..."}
"""

import argparse
import ctypes
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

CLUSTER_TIMEOUT_S = 30.0
# Mooncake logs INFO lines for every client setup; keep the bench output clean
# unless the caller asked for a level.
os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
# The transfer engine advertises this address to peers (without it, the first
# non-loopback interface). Its listening sockets still bind 0.0.0.0 / [::].
os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")

# mooncake-store/include/types.h (ErrorCode), for readable error samples.
ERROR_NAMES = {
    -1: "INTERNAL_ERROR", -10: "BUFFER_OVERFLOW", -100: "SHARD_INDEX_OUT_OF_RANGE",
    -101: "AVAILABLE_SEGMENT_EMPTY", -200: "NO_AVAILABLE_HANDLE",
    -300: "INVALID_VERSION", -400: "INVALID_KEY", -500: "WRITE_FAIL",
    -600: "INVALID_PARAMS", -601: "ILLEGAL_CLIENT", -700: "INVALID_WRITE",
    -701: "INVALID_READ", -702: "INVALID_REPLICA", -703: "REPLICA_IS_NOT_READY",
    -704: "OBJECT_NOT_FOUND", -705: "OBJECT_ALREADY_EXISTS", -706: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED", -708: "OBJECT_HAS_REPLICATION_TASK", -714: "OBJECT_REPLICA_BUSY",
    -800: "TRANSFER_FAIL", -900: "RPC_FAIL", -901: "RPC_TIMEOUT",
    -1010: "UNAVAILABLE_IN_CURRENT_STATUS", -1700: "TENANT_QUOTA_EXCEEDED",
}


def log(msg):
    print(f"mooncake_driver: {msg}", file=sys.stderr, flush=True)


def die(msg, code=1):
    log(f"error: {msg}")
    sys.exit(code)


def err_name(rc):
    return f"{rc} {ERROR_NAMES.get(rc, 'UNKNOWN')}"


def version():
    from importlib import metadata

    for d in metadata.distributions():
        name = (d.metadata.get("Name") or "").lower()
        if name.startswith("mooncake-transfer-engine"):
            return d.version
    return "unknown"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master_binary():
    cands = [os.path.join(os.path.dirname(sys.executable), "mooncake_master")]
    try:
        import importlib.util

        spec = importlib.util.find_spec("mooncake")
        if spec and spec.submodule_search_locations:
            for d in spec.submodule_search_locations:
                cands.insert(0, os.path.join(d, "mooncake_master"))
    except Exception:  # noqa: BLE001
        pass
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    die(f"mooncake_master not found (looked in {cands}); run scripts/setup-mooncake.sh")


def _pdeathsig():
    # Dies with the parent even when the parent is SIGKILLed.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001
        pass


def listening(pid):
    """The TCP addresses process `pid` listens on (from /proc)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if t.startswith("socket:["):
                inodes.add(t[8:-1])
    except OSError:
        return []
    out = []
    for fam in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{fam}") as f:
                next(f)
                for line in f:
                    p = line.split()
                    if p[3] != "0A" or p[9] not in inodes:
                        continue
                    hexip, hexport = p[1].split(":")
                    port = int(hexport, 16)
                    raw = bytes.fromhex(hexip)
                    if fam == "tcp":
                        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
                    else:
                        ip = "[" + socket.inet_ntop(
                            socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                        ) + "]"
                    out.append(f"{ip}:{port}")
        except OSError:
            pass
    return sorted(set(out))


# ---------------------------------------------------------------- store client


def new_store(master, metadata, segment_bytes, local_buffer):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", metadata, int(segment_bytes), int(local_buffer), "tcp", "", master)
    if rc != 0:
        raise RuntimeError(f"MooncakeDistributedStore.setup failed: {err_name(rc)} "
                           f"(master {master}, metadata {metadata})")
    return s


def close_store(store, timeout=5.0):
    t = threading.Thread(target=store.close, daemon=True)
    t.start()
    t.join(timeout)


class Buf:
    """A page-touched buffer and its address, registered with the store."""

    def __init__(self, store, n, register=True):
        self.n = n
        self.b = bytearray(os.urandom(min(n, 4096)) * (n // 4096 + 1))[:n]
        self.c = (ctypes.c_char * n).from_buffer(self.b)
        self.addr = ctypes.addressof(self.c)
        self.store = None
        if register:
            rc = store.register_buffer(self.addr, n)
            if rc != 0:
                raise RuntimeError(f"register_buffer failed: {err_name(rc)}")
            self.store = store

    def close(self):
        # Unregister before the memory is freed: the transfer engine refuses a
        # later registration that overlaps a stale one (INVALID_PARAMS).
        if self.store is not None:
            self.store.unregister_buffer(self.addr)
            self.store = None


def stamp(tag, j):
    return struct.pack("<Q", (tag << 32) ^ j)


# ---------------------------------------------------------------- subcommand: cluster


def cluster(a):
    t0 = time.monotonic()
    deadline = t0 + a.timeout
    ready_file = os.path.abspath(a.ready_file)
    log_path = os.path.abspath(a.log or ready_file + ".log")
    logf = open(log_path, "ab", buffering=0)
    children = []  # (role, Popen)
    stopping = {"sig": None}

    def stop_children():
        for _, p in children:
            if p.poll() is None:
                try:
                    p.terminate()
                except OSError:
                    pass
        end = time.monotonic() + 5
        for _, p in children:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    p.kill()
                    p.wait(2)
                except (OSError, subprocess.TimeoutExpired):
                    pass

    def on_signal(signum, _frame):
        stopping["sig"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    def fail(msg):
        stop_children()
        try:
            with open(log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 3000))
                tail = f.read().decode(errors="replace")
            log(f"last lines of {log_path}:\n{tail}")
        except OSError:
            pass
        die(msg)

    def check(what):
        if stopping["sig"] is not None:
            stop_children()
            log(f"signal {stopping['sig']} during start-up; stopped")
            sys.exit(0)
        for role, p in children:
            if p.poll() is not None:
                fail(f"{role} exited with status {p.returncode} while {what}")
        if time.monotonic() > deadline:
            fail(f"the Mooncake cluster did not come up within {a.timeout:.0f} s ({what})")

    rpc, http, metrics = free_port(), free_port(), free_port()
    while len({rpc, http, metrics}) < 3:
        http, metrics = free_port(), free_port()
    master_cmd = [
        master_binary(),
        "--rpc_address=127.0.0.1", f"--rpc_port={rpc}",
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={http}",
        "--metrics_host=127.0.0.1", f"--metrics_port={metrics}",
    ] + list(a.master_arg or [])
    log(f"starting {' '.join(master_cmd)} (log: {log_path})")
    children.append(("mooncake_master", subprocess.Popen(
        master_cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
        preexec_fn=_pdeathsig)))
    master = f"127.0.0.1:{rpc}"
    metadata = f"http://127.0.0.1:{http}/metadata"

    # Master RPC port, then the metadata server (any HTTP answer will do).
    while True:
        check("waiting for the master's RPC port")
        try:
            socket.create_connection(("127.0.0.1", rpc), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    while True:
        check("waiting for the HTTP metadata server")
        try:
            urllib.request.urlopen(metadata + "?key=kvtier_probe", timeout=1).read()
            break
        except urllib.error.HTTPError:
            break  # 404 for a missing key: it answers
        except (OSError, ValueError):
            time.sleep(0.05)

    env = dict(os.environ, MC_LOG_LEVEL=os.environ.get("KVTIER_MOONCAKE_SEGMENT_LOG_LEVEL", "INFO"))
    seg = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "_segment", "--master", master,
         "--metadata", metadata, "--mem", str(a.mem)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf, env=env,
        preexec_fn=_pdeathsig)
    children.append(("segment holder", seg))
    line = b""
    while not line.endswith(b"\n"):
        check("waiting for the segment holder's setup")
        r, _, _ = select.select([seg.stdout], [], [], 0.2)
        if r:
            chunk = os.read(seg.stdout.fileno(), 256)
            if not chunk:
                check("reading the segment holder")
                fail("segment holder closed its stdout before it was ready")
            line += chunk
    if not line.startswith(b"ready"):
        fail(f"segment holder said {line!r}")

    # End to end: a client without memory puts, reads back and removes a key.
    while True:
        check("probing put/get through the store")
        left = max(1.0, deadline - time.monotonic())
        try:
            pr = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "_probe", "--master", master,
                 "--metadata", metadata],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=logf,
                timeout=left, preexec_fn=_pdeathsig)
            if pr.returncode == 0:
                break
            log(f"probe failed ({pr.stdout.decode(errors='replace').strip()}); retrying")
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.2)

    pids = [p.pid for _, p in children]
    info = {
        "master": master,
        "metadata": metadata,
        "protocol": "tcp",
        "pids": pids,
        "version": version(),
        "segment_bytes": a.mem,
        "log": log_path,
        "listen": {role: listening(p.pid) for role, p in children},
        "startup_s": round(time.monotonic() - t0, 3),
    }
    tmp = ready_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, ready_file)
    log(f"ready in {info['startup_s']} s: {json.dumps(info)}")

    # Watch stdin only when it is a pipe or socket (not /dev/null or a tty).
    import stat

    try:
        mode = os.fstat(0).st_mode
        watch_stdin = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
    except OSError:
        watch_stdin = False
    code = 0
    while stopping["sig"] is None:
        dead = [(r, p) for r, p in children if p.poll() is not None]
        if dead:
            log(f"{dead[0][0]} exited with status {dead[0][1].returncode}; stopping")
            code = 1
            break
        if watch_stdin:
            try:
                r, _, _ = select.select([0], [], [], 0.5)
            except InterruptedError:
                continue
            if r:
                try:
                    data = os.read(0, 4096)
                except OSError:
                    data = b""
                if not data:
                    log("stdin closed; stopping")
                    break
        else:
            time.sleep(0.5)
    if stopping["sig"] is not None:
        log(f"signal {stopping['sig']}; stopping")
    stop_children()
    try:
        os.remove(ready_file)
    except OSError:
        pass
    sys.exit(code)


def segment(a):
    """Child of `cluster`: holds the store's memory until stdin closes or SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        store = new_store(a.master, a.metadata, a.mem, 16 << 20)
    except Exception as e:  # noqa: BLE001
        print(f"error {e}", flush=True)
        sys.exit(1)
    print("ready", flush=True)
    while True:
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    close_store(store)
    os._exit(0)


def probe(a):
    """Child of `cluster`: put, read back and remove one small key."""
    try:
        store = new_store(a.master, a.metadata, 0, 16 << 20)
        n = 4096
        src, dst = Buf(store, n), Buf(store, n)
        key = f"kvtier-probe-{os.getpid()}-{time.time_ns()}"
        rc = store.put_from(key, src.addr, n)
        if rc != 0:
            raise RuntimeError(f"put_from {err_name(rc)}")
        got = store.get_into(key, dst.addr, n)
        if got != n or bytes(dst.b) != bytes(src.b):
            raise RuntimeError(f"get_into returned {got}, data equal: {bytes(dst.b) == bytes(src.b)}")
        store.remove(key, True)
        src.close()
        dst.close()
    except Exception as e:  # noqa: BLE001
        print(f"probe: {e}", flush=True)
        os._exit(1)
    close_store(store)
    os._exit(0)


# ---------------------------------------------------------------- subcommand: run


def work(store, api, op, value_size, wid, tag, keys, t_warm, t_end, run_id, seq0=0):
    """One closed-loop worker: [(t_done_ns, latency_us, error or None)] of the measured window."""
    n = value_size
    buf = Buf(store, n, register=(api == "buffer"))
    try:
        return _work(store, api, op, n, wid, tag, keys, t_warm, t_end, run_id, seq0, buf)
    finally:
        buf.close()


def _work(store, api, op, n, wid, tag, keys, t_warm, t_end, run_id, seq0, buf):
    out = []
    i = 0
    mv = memoryview(buf.b)
    while True:
        t = time.monotonic_ns()
        if t >= t_end:
            break
        err = None
        if op == "put":
            key = f"kvt-{run_id}-{wid}-{seq0 + i}"
            s = stamp(tag, wid * 1_000_003 + i)
            mv[0:8] = s
            mv[n - 8:n] = s
            t0 = time.monotonic_ns()
            try:
                rc = store.put_from(key, buf.addr, n) if api == "buffer" else store.put(key, mv)
            except Exception as e:  # noqa: BLE001
                rc = f"exception {e!r}"
            t1 = time.monotonic_ns()
            if rc != 0:
                err = f"put {key}: " + (err_name(rc) if isinstance(rc, int) else str(rc))
        else:
            j = (wid * 7919 + i) % keys
            key = f"kvt-{run_id}-pre-{j}"
            s = stamp(tag, j)
            if api == "buffer":
                mv[0:8] = b"\0" * 8
                mv[n - 8:n] = b"\0" * 8
                t0 = time.monotonic_ns()
                try:
                    got = store.get_into(key, buf.addr, n)
                except Exception as e:  # noqa: BLE001
                    got = f"exception {e!r}"
                t1 = time.monotonic_ns()
                if got != n:
                    err = f"get_into {key}: " + (
                        err_name(got) if isinstance(got, int) and got < 0
                        else f"returned {got}, expected {n}")
                elif mv[0:8] != s or mv[n - 8:n] != s:
                    err = f"get_into {key}: wrong content (stamp mismatch)"
            else:
                t0 = time.monotonic_ns()
                try:
                    data = store.get(key)
                except Exception as e:  # noqa: BLE001
                    data = None
                    err = f"get {key}: exception {e!r}"
                t1 = time.monotonic_ns()
                if err is None:
                    if len(data) != n:
                        err = f"get {key}: {len(data)} bytes, expected {n}"
                    elif data[0:8] != s or data[n - 8:n] != s:
                        err = f"get {key}: wrong content (stamp mismatch)"
        if t1 >= t_warm and t1 < t_end:
            out.append((t1, (t1 - t0 + 500) // 1000, err))
        i += 1
    return out


def preload(store, api, value_size, keys, run_id, tag, deadline):
    n = value_size
    buf = Buf(store, n, register=(api == "buffer"))
    mv = memoryview(buf.b)
    for j in range(keys):
        if time.monotonic() > deadline:
            die(f"preloading {keys} keys took too long")
        s = stamp(tag, j)
        mv[0:8] = s
        mv[n - 8:n] = s
        key = f"kvt-{run_id}-pre-{j}"
        rc = store.put_from(key, buf.addr, n) if api == "buffer" else store.put(key, mv)
        if rc != 0:
            die(f"preloading key {j} of {keys} failed: {err_name(rc)} "
                f"({keys} x {n} bytes must fit in the store's segment; try a smaller --keys)")
    buf.close()
    ex = store.batch_is_exist([f"kvt-{run_id}-pre-{j}" for j in range(keys)])
    missing = sum(1 for e in ex if e != 1)
    if missing:
        die(f"{missing} of {keys} preloaded keys are gone already (evicted?); try a smaller --keys")


def cpu_s():
    t = os.times()
    return t.user + t.system


def worker_proc(a):
    """Child of `run --workers processes`: one store client, one worker."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(1))
    try:
        store = new_store(a.master, a.metadata, 0, (16 << 20) + 2 * a.value_size)
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"error": str(e)}), flush=True)
        os._exit(1)
    print(json.dumps({"ready": True}), flush=True)
    go = sys.stdin.readline()
    if not go:
        os._exit(1)
    t_warm, t_end = map(int, go.split())
    state = {}

    def sample_cpu():
        # CPU of this whole process (its transfer-engine threads included)
        # over the measured window.
        time.sleep(max(0, (t_warm - time.monotonic_ns()) / 1e9))
        state["c0"] = cpu_s()
        time.sleep(max(0, (t_end - time.monotonic_ns()) / 1e9))
        state["c1"] = cpu_s()

    th = threading.Thread(target=sample_cpu, daemon=True)
    th.start()
    samples = work(store, a.api, a.op, a.value_size, a.wid, a.tag, a.keys, t_warm, t_end, a.run_id)
    th.join(5)
    cpu = state.get("c1", cpu_s()) - state.get("c0", cpu_s())
    print(json.dumps({"samples": samples, "cpu": cpu}), flush=True)
    close_store(store, 3)
    os._exit(0)


def run(a):
    if a.concurrency < 1 or a.value_size < 16 or a.duration <= 0 or a.warmup < 0:
        die("need --concurrency >= 1, --value-size >= 16, --duration > 0, --warmup >= 0")
    run_id = f"{os.getpid():x}{time.time_ns() & 0xffffffff:08x}"
    tag = int.from_bytes(os.urandom(4), "little")
    keys = a.keys
    deadline = time.monotonic() + 60 + keys * 0.5
    api_name = {("buffer", "put"): "put_from", ("buffer", "get"): "get_into",
                ("bytes", "put"): "put", ("bytes", "get"): "get"}[(a.api, a.op)]
    C = a.concurrency
    try:
        # Threads share this client; it also preloads and cleans up.
        store = new_store(a.master, a.metadata, 0, (16 << 20) + 2 * C * a.value_size)
    except Exception as e:  # noqa: BLE001
        die(str(e))
    if a.op == "get":
        preload(store, a.api, a.value_size, keys, run_id, tag, deadline)

    samples = []
    errors_total = 0
    if a.workers == "threads":
        results = [None] * C
        t_start = time.monotonic_ns() + 50_000_000
        t_warm = t_start + int(a.warmup * 1e9)
        t_end = t_warm + int(a.duration * 1e9)

        def th(w):
            try:
                time.sleep(max(0, (t_start - time.monotonic_ns()) / 1e9))
                results[w] = work(store, a.api, a.op, a.value_size, w, tag, keys, t_warm, t_end, run_id)
            except Exception as e:  # noqa: BLE001
                results[w] = e

        ths = [threading.Thread(target=th, args=(w,), daemon=True) for w in range(C)]
        for t in ths:
            t.start()
        time.sleep(max(0, (t_warm - time.monotonic_ns()) / 1e9))
        c0 = cpu_s()
        time.sleep(max(0, (t_end - time.monotonic_ns()) / 1e9))
        c1 = cpu_s()
        join_deadline = time.monotonic() + a.op_timeout
        for t in ths:
            t.join(max(0.0, join_deadline - time.monotonic()))
        gen_cpu = c1 - c0
        stuck = 0
        for w, r in enumerate(results):
            if isinstance(r, list):
                samples.extend(r)
            elif isinstance(r, Exception):
                die(f"worker {w} failed: {r!r}")
            else:
                stuck += 1
        if stuck:
            log(f"{stuck} workers still inside an operation {a.op_timeout:.0f} s after the run ended")
            samples.extend((t_end, int(a.op_timeout * 1e6), f"op still running {a.op_timeout:.0f} s after the end")
                           for _ in range(stuck))
    else:
        procs = []
        for w in range(C):
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "_worker", "--master", a.master,
                 "--metadata", a.metadata, "--op", a.op, "--api", a.api,
                 "--value-size", str(a.value_size), "--keys", str(keys), "--wid", str(w),
                 "--tag", str(tag), "--run-id", run_id],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=_pdeathsig))

        def kill_all():
            for p in procs:
                if p.poll() is None:
                    p.kill()

        def read_line(p, until):
            buf = b""
            while not buf.endswith(b"\n"):
                left = until - time.monotonic()
                if left <= 0:
                    return None
                r, _, _ = select.select([p.stdout], [], [], min(left, 0.5))
                if r:
                    chunk = os.read(p.stdout.fileno(), 1 << 20)
                    if not chunk:
                        return buf or None
                    buf += chunk
            return buf

        until = time.monotonic() + 30 + 0.5 * C
        for w, p in enumerate(procs):
            line = read_line(p, until)
            if not line or b'"ready"' not in line:
                kill_all()
                die(f"worker process {w} did not start: {line!r}")
        t_start = time.monotonic_ns() + 50_000_000
        t_warm = t_start + int(a.warmup * 1e9)
        t_end = t_warm + int(a.duration * 1e9)
        for p in procs:
            p.stdin.write(f"{t_warm} {t_end}\n".encode())
            p.stdin.flush()
        time.sleep(max(0, (t_end - time.monotonic_ns()) / 1e9))
        until = time.monotonic() + a.op_timeout
        gen_cpu = 0.0
        stuck = 0
        for w, p in enumerate(procs):
            line = read_line(p, until)
            try:
                r = json.loads(line)
                samples.extend(tuple(s) for s in r["samples"])
                gen_cpu += r["cpu"]
            except (TypeError, ValueError, KeyError):
                stuck += 1
                log(f"worker process {w} gave no result: {line!r}")
        kill_all()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if stuck:
            samples.extend((t_end, int(a.op_timeout * 1e6), "worker process gave no result")
                           for _ in range(stuck))

    samples.sort(key=lambda s: s[0])
    err_samples = []
    for s in samples:
        if s[2] is not None:
            errors_total += 1
            if len(err_samples) < 5:
                err_samples.append(s[2])
    out = {
        "op": a.op,
        "api": api_name,
        "concurrency": C,
        "workers": a.workers,
        "duration_s": a.duration,
        "ops": len(samples),
        "errors": errors_total,
        "error_samples": err_samples,
        "latencies_us": [int(s[1]) for s in samples],
        "generator_cpu_s": round(gen_cpu, 4),
        "value_size": a.value_size,
        "keys": keys if a.op == "get" else None,
    }
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    if not a.keep:
        # Leave the store as this run found it: Mooncake evicts only objects
        # whose lease (default 10 s after a put or get) has expired, so this
        # run's keys would otherwise crowd out the next run's.
        t = threading.Thread(target=cleanup, args=(store, run_id), daemon=True)
        t.start()
        t.join(20)
    close_store(store)
    os._exit(0)


def cleanup(store, run_id):
    try:
        n = store.remove_by_regex(f"^kvt-{run_id}-", True)
        if n < 0:
            log(f"cleanup: remove_by_regex failed: {err_name(n)}")
    except Exception as e:  # noqa: BLE001
        log(f"cleanup failed: {e!r}")


# ---------------------------------------------------------------- subcommand: reference


def reference(_a):
    # Mooncake's store benchmarks (mooncake-store/benchmarks/store_kv_bench.py,
    # store_api_benchmark.py, mooncake-store/tests/stress_cluster_benchmark.py,
    # the C++ *_bench targets) live only in its source tree. The wheel
    # (mooncake-transfer-engine-non-cuda) ships transfer_engine_bench, which
    # measures raw transfer-engine reads/writes between two segments (no
    # master, no put/get), so it is not a store benchmark.
    die("no Mooncake Store benchmark tool is shipped in the installed package "
        "(only transfer_engine_bench, a transfer-engine benchmark)", code=3)


# ---------------------------------------------------------------- main


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("cluster", help="start master + segment holder; run until stdin closes / SIGTERM")
    c.add_argument("--mem", type=int, required=True, help="segment (store capacity) in bytes")
    c.add_argument("--ready-file", required=True)
    c.add_argument("--log", help="child processes' log (default: READY_FILE.log)")
    c.add_argument("--timeout", type=float, default=CLUSTER_TIMEOUT_S)
    c.add_argument("--master-arg", action="append", help="extra mooncake_master flag (repeatable)")

    r = sub.add_parser("run", help="closed-loop put/get load; JSON result on stdout")
    r.add_argument("--master", required=True)
    r.add_argument("--metadata", required=True)
    r.add_argument("--op", choices=["put", "get"], required=True)
    r.add_argument("--concurrency", type=int, required=True)
    r.add_argument("--duration", type=float, required=True)
    r.add_argument("--warmup", type=float, default=1.0)
    r.add_argument("--value-size", type=int, required=True)
    r.add_argument("--keys", type=int, default=256, help="keys preloaded for get (default 256)")
    r.add_argument("--api", choices=["buffer", "bytes"], default="buffer",
                   help="buffer: put_from/get_into with registered buffers (default); bytes: put/get")
    r.add_argument("--workers", choices=["threads", "processes"], default="threads",
                   help="threads share one client (the binding releases the GIL); "
                        "processes: one client each")
    r.add_argument("--keep", action="store_true",
                   help="leave this run's keys in the store (default: remove them after the run)")
    r.add_argument("--op-timeout", type=float, default=30.0,
                   help="how long to wait for in-flight ops after the run ends")

    ref = sub.add_parser("reference", help="Mooncake's own benchmark (none shipped: exits 3)")
    for f in ("--master", "--metadata", "--concurrency", "--value-size", "--duration"):
        ref.add_argument(f)

    sub.add_parser("version")

    s = sub.add_parser("_segment")
    s.add_argument("--master", required=True)
    s.add_argument("--metadata", required=True)
    s.add_argument("--mem", type=int, required=True)

    pr = sub.add_parser("_probe")
    pr.add_argument("--master", required=True)
    pr.add_argument("--metadata", required=True)

    w = sub.add_parser("_worker")
    for f in ("--master", "--metadata", "--op", "--api", "--run-id"):
        w.add_argument(f, required=True)
    for f in ("--value-size", "--keys", "--wid", "--tag"):
        w.add_argument(f, type=int, required=True)

    a = p.parse_args()
    if a.cmd == "version":
        print(json.dumps({"version": version()}))
    elif a.cmd == "cluster":
        cluster(a)
    elif a.cmd == "run":
        run(a)
    elif a.cmd == "reference":
        reference(a)
    elif a.cmd == "_segment":
        segment(a)
    elif a.cmd == "_probe":
        probe(a)
    elif a.cmd == "_worker":
        worker_proc(a)


if __name__ == "__main__":
    main()
